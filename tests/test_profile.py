"""``simsrv profile`` on a tiny grid on CPU, then ``simsrv calibrate`` on its output."""

import polars as pl
import pytest

from tests.test_cli import simsrv

torch = pytest.importorskip("torch", reason="PyTorch is the optional extra simsrv[profile]; not installed")


def test_tiny_cpu_profile_feeds_calibrate(tmp_path):
    prof = tmp_path / "kernels_profile" / "mybox"
    p = simsrv("profile", "--out", prof, "--gpu", "l40s", "--tiny", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    df = pl.read_parquet(prof / "l40s.parquet")
    assert set(df["op"]) == {"gemm", "attn_prefill", "attn_decode"}
    assert (df["time_ms"] > 0).all() and df["source"][0].startswith("simsrv profile (cpu, torch")
    assert len(df.filter(pl.col("op") == "gemm")) == 3 * 2 * 2
    out = tmp_path / "cal.json"
    p = simsrv("calibrate", "--gpu", "l40s", "--profiles", prof, "--out", out)
    assert p.returncode == 0, p.stderr
    import json

    cal = json.loads(out.read_text())
    assert {"gemm", "attn_prefill", "attn_decode"} <= set(cal) and "overhead" not in cal
    assert cal["gemm"]["m"] == [1, 16, 64]
