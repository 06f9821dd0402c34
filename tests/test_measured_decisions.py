"""Fast-path decisions measured on this machine (issue 22 item 1): measured once per machine fingerprint, said in
one line, cached; read back by later processes; a corrupt or unwritable cache measures again in memory with a
note; measuring off (VITKIT_MEASURE=0) leaves the flag rules; a path is on only where it measured >= 1.03x."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vitkit import hardware
from vitkit.errors import ConfigError
from vitkit.hardware import MEASURABLE, MEASURED_WIN, Capabilities, decide, detect, machine_key, measure_rounds

PRINT_DECISIONS = ("import json; from vitkit.hardware import this_machine; "
                   "print(json.dumps({k: v['on'] for k, v in this_machine().to_dict()['paths'].items()}))")


def _run(cache_dir, measure: str = "1", **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("VITKIT_FAST_PATHS",)}
    # three rounds per path, not 15: these tests are about when it measures and what is cached, not the ratios
    full |= {"VITKIT_CACHE": str(cache_dir), "VITKIT_MEASURE": measure, "VITKIT_MEASURE_ROUNDS": "3", **env}
    return subprocess.run([sys.executable, "-c", PRINT_DECISIONS], env=full, capture_output=True, text=True,
                          timeout=300, check=False)


def test_measured_once_said_once_cached_and_read_back(tmp_path):
    # another machine's entry (another fingerprint) is in the cache already: not this machine's, so measured
    # here, and kept beside this machine's
    other = {"ratios": {"bf16": 9.0}, "rounds": 3, "seconds": 1.0, "date": "2026-01-01", "shapes": {}}
    (tmp_path / "fast-paths.json").write_text(json.dumps({"another machine": other}))
    first = _run(tmp_path)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and "timing this machine's fast paths once" in lines[0] and str(tmp_path) in lines[0]
    cache = json.loads((tmp_path / "fast-paths.json").read_text())
    assert cache.pop("another machine") == other
    (key, entry), = cache.items()
    assert set(entry["ratios"]) >= {"bf16", "matmul_attention", "native_encoder"}
    # None: not timed here, for the reason recorded (the widened bf16 path where oneDNN has a bf16 matmul)
    assert all((name in entry["untimed"]) if r is None else r > 0 for name, r in entry["ratios"].items())
    assert entry["seconds"] < 60 and entry["rounds"] == 3
    # the decisions follow the ratios with the 3% bar
    decided = json.loads(first.stdout)
    for name, r in entry["ratios"].items():
        if r is not None:
            assert decided[name] == (r >= MEASURED_WIN), (name, r)
    second = _run(tmp_path)
    assert second.returncode == 0 and second.stderr.strip() == "" and json.loads(second.stdout) == decided
    assert len(json.loads((tmp_path / "fast-paths.json").read_text())) == 2
    assert entry["method"] == hardware.METHOD


def test_an_entry_made_by_another_method_is_measured_again(tmp_path, monkeypatch):
    """Session 36's bug: entries timed on meta tensors (15 rounds in 0.9 s, bf16 '1.04x' where it is emulated)
    were read back as this machine's. An entry without the current METHOD is not this machine's measurement."""
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path))
    key = machine_key(detect())
    full = {name: 1.5 for name in MEASURABLE}
    for method in (None, hardware.METHOD - 1, hardware.METHOD):
        entry = {"ratios": full, "date": "2026-12-03", "rounds": 15, "seconds": 0.9, "shapes": {}}
        if method is not None:
            entry["method"] = method
        (tmp_path / "fast-paths.json").write_text(json.dumps({key: entry}))
        assert (hardware.cached_measurement(detect()) == entry) == (method == hardware.METHOD), method


def test_where_bf16_is_emulated_its_other_paths_are_not_timed_and_the_rules_decide(tmp_path):
    """Under the AVX2 cap (bf16 emulated on most CPUs) timing every bf16 path took 64 s on a Zen 4; a bf16 linear
    under EMULATED_BF16 x fp32 skips them (None in the cache), so the flag rules decide them, and is quick."""
    res = _run(tmp_path, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    assert res.returncode == 0, res.stderr
    (entry,) = json.loads((tmp_path / "fast-paths.json").read_text()).values()
    ratios = entry["ratios"]
    bf16_paths = ("native_encoder", "matmul_attention", "matmul_attention_training", "bf16_training")
    emulated = ratios["bf16"] < hardware.EMULATED_BF16
    assert all((ratios[p] is None) == emulated for p in bf16_paths), ratios
    decided = json.loads(res.stdout)
    if emulated:
        assert not any(decided[p] for p in bf16_paths)  # the AVX2 rule: off
        assert entry["seconds"] < 20
    else:
        assert all(decided[p] == (ratios[p] >= MEASURED_WIN) for p in bf16_paths)


def test_corrupt_or_unwritable_cache_measures_in_memory_with_a_note(tmp_path):
    (tmp_path / "fast-paths.json").write_text("{not json")
    res = _run(tmp_path)
    assert res.returncode == 0 and "timing this machine" in res.stderr  # a corrupt cache is replaced
    assert json.loads((tmp_path / "fast-paths.json").read_text())
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the cache folder would be under a plain file: cannot be created
    res = _run(blocked / "cache")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 and "could not cache the measurement" in lines[1] and json.loads(res.stdout)


def test_measuring_off_leaves_the_flag_rules(tmp_path):
    res = _run(tmp_path, measure="0")
    assert res.returncode == 0 and res.stderr.strip() == "" and not (tmp_path / "fast-paths.json").exists()
    rules = decide(detect())
    assert json.loads(res.stdout) == {name: on for name, on, _ in rules.rows()}


def test_a_measurement_decides_over_the_rule_at_the_three_percent_bar():
    zen4 = Capabilities(cpu="AMD EPYC", vendor="AuthenticAMD", avx2=True, avx512f=True, avx512_bf16=True)
    prior = decide(zen4)
    assert prior.onednn_linear and prior.bf16  # the rule for this kind
    slower = decide(zen4, measured={"date": "d", "ratios": {name: 1.02 for name in MEASURABLE}})
    assert not any(getattr(slower, name) for name in MEASURABLE)
    assert "under 1.03x" in slower.why["onednn_linear"] and "flag rule says on" in slower.why["onednn_linear"]
    faster = decide(Capabilities(avx2=True), measured={"date": "d", "ratios": {name: 1.03 for name in MEASURABLE}})
    assert all(getattr(faster, name) for name in MEASURABLE)
    forced = decide(zen4, overrides={"bf16": False}, measured={"date": "d", "ratios": {"bf16": 2.0}})
    assert not forced.bf16  # VITKIT_FAST_PATHS still wins


def test_the_fingerprint_names_cpu_flags_cores_threads_and_runtime_versions():
    key = machine_key(detect())
    caps = detect()
    assert caps.cpu in key and f"{caps.cores} cores" in key and "threads" in key and f"torch {caps.torch}" in key
    assert "oneDNN" in key and "onnxruntime" in key and "openvino" in key
    assert ",".join(caps.isa_flags()) in key
    assert hardware.cached_measurement(caps) is None or isinstance(hardware.cached_measurement(caps), dict)


def test_rounds_default_to_fifteen_and_a_bad_count_is_one_line(monkeypatch):
    monkeypatch.delenv("VITKIT_MEASURE_ROUNDS", raising=False)
    assert measure_rounds() == 15
    monkeypatch.setenv("VITKIT_MEASURE_ROUNDS", "4")
    assert measure_rounds() == 4
    for bad in ("many", "0", "-2"):
        monkeypatch.setenv("VITKIT_MEASURE_ROUNDS", bad)
        with pytest.raises(ConfigError, match="VITKIT_MEASURE_ROUNDS") as e:
            measure_rounds()
        assert "\n" not in str(e.value)


def test_measured_on_the_cpu_under_a_meta_default_device(monkeypatch):
    """`vitkit bench` builds its models under `with torch.device("meta")` to size them; the first build asks for
    the decisions. Measured there, every timed call ran on meta tensors (15 rounds in 0.9 s, bf16 'won' on a
    CPU that emulates it) and the wrong ratios were cached for every later command."""
    from vitkit import hardware

    seen = []

    def record(a, b, rounds):
        seen.append(torch.empty(0).device.type)  # the default device while the paths are timed
        return 1.0

    monkeypatch.setattr(hardware, "_paired_median", record)
    with torch.device("meta"):
        hardware.measure(2)
    assert seen and set(seen) == {"cpu"}
