"""Shipping a model: ONNX export with a parity check, an ONNX Runtime runner, int8 quantisation and the report
that says whether the int8 model is worth shipping; OpenVINO IR export and runner; `runner`, one callable over
every backend."""
from .int8 import INT8_MAX_DROP_POINTS, INT8_MIN_SPEEDUP, int8_report, int8_warning
from .onnx import ExportError, OnnxRunner, compare_top1, export_onnx, quantize_int8
from .openvino import OpenVinoRunner, export_openvino
from .runner import Runner, runner

__all__ = ["INT8_MAX_DROP_POINTS", "INT8_MIN_SPEEDUP", "ExportError", "OnnxRunner", "OpenVinoRunner", "Runner",
           "compare_top1", "export_onnx", "export_openvino", "int8_report", "int8_warning", "quantize_int8", "runner"]
