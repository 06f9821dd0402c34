"""Shipping a model: ONNX export with a parity check, an ONNX Runtime runner, int8 quantisation."""
from .onnx import ExportError, OnnxRunner, compare_top1, export_onnx, quantize_int8

__all__ = ["ExportError", "OnnxRunner", "compare_top1", "export_onnx", "quantize_int8"]
