"""benchmarks/gpu.py runs its GPU code path on the CPU with a tiny config, so that it cannot rot between GPU runs."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_runs_on_cpu_with_a_tiny_config(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu.py"),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--config",
            "tiny",
            "--lengths",
            "64,128",
            "--repeats",
            "1",
            "--new-tokens",
            "4",
            "--peak-tflops",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "gpu-benchmark.json").read_text())
    (model,) = report["models"]
    assert model["config"] == "tiny" and model["attention_kernel"] != "unknown"
    assert [p["length"] for p in model["lengths"]] == [64, 128]
    for point in model["lengths"]:
        assert len(point["paths"]) == 4 and all(p["status"] == "ok" for p in point["paths"].values())
        assert all(p["tokens_per_s"] > 0 and 0 < p["mfu"] and p["peak_gib"] > 0 for p in point["paths"].values())
        assert point["ctxeval_over_naive_time"] > 0 and point["forward_tflops"] > 0
    # the FLOP formula: 2 N L + 2 n_layers L^2 d_attn, N without the embedding table
    import torch  # noqa: F401

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu

    m = gpu.build("tiny", "cpu", torch.float32, "sdpa")
    n = sum(p.numel() for p in m.parameters()) - m.get_input_embeddings().weight.numel()
    assert gpu.forward_flops(m, 128) == 2 * n * 128 + 2 * 2 * 128 * 128 * 64
    table = (tmp_path / "gpu-benchmark.md").read_text()
    assert "ctxeval ppl (chunked loss)" in table and "| tiny |" in table


def test_gpu_attention_benchmark_runs_on_cpu_with_a_tiny_config(tmp_path):
    methods = "none;yarn:factor=4;self-extend:group_size=4,neighbor_window=16;rerope:window=16;ntk:factor=2+logn"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_attention.py"),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--config",
            "tiny",
            "--lengths",
            "64,128",
            "--methods",
            methods,
            "--new-tokens",
            "3",
            "--check-length",
            "100",
            "--peak-tflops",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "gpu-attention.json").read_text())
    (model,) = report["models"]
    # the fast kernels equal the chunked reference; yarn and none run the model's own attention (not checked)
    assert set(model["exactness"]) == set(methods.split(";")[2:])
    assert all(diff < 1e-4 for diff in model["exactness"].values())
    points = {(p["method"], p["length"]): p for p in model["points"]}
    assert len(points) == 10 and all(p["status"] == "ok" for p in points.values())
    assert points[("rerope:window=16", 128)]["kernel"] == "fused"
    assert points[("ntk:factor=2+logn", 64)]["kernel"] == "query-scale"
    for p in points.values():
        assert p["tokens_per_s"] > 0 and p["mfu"] > 0 and p["decode_ms_per_token"] > 0
        assert p["time_ratio"] > 0 and p["decode_ratio"] > 0
    assert points[("none", 64)]["time_ratio"] == 1.0 and points[("yarn:factor=4", 128)]["decode_ratio"] == 1.0
    table = (tmp_path / "gpu-attention.md").read_text()
    assert "| tiny | 128 | self-extend:group_size=4,neighbor_window=16 | fused |" in table
