"""The planner's names: hardware (exact or alias, never a prefix), models (HF ids, Ollama
names, presets) and GGUF dtypes by their real names, each refusal with "did you mean"."""

import csv
from importlib import resources

import pytest

from verispec.plan import catalogue, dtype_bits, get_preset, load_shape, parse_hardware
from verispec.plan.shapes import DTYPE_BITS, HEAD_BITS


@pytest.mark.parametrize("name,full", [
    ("m1", "Apple M1"), ("Apple M1", "Apple M1"), ("M1", "Apple M1"), ("m1-pro", "Apple M1 Pro"),
    ("M1 Max", "Apple M1 Max"), ("m1 ultra", "Apple M1 Ultra"), ("m3", "Apple M3"), ("M4 Max", "Apple M4 Max"),
    ("m4-max-32c", "Apple M4 Max 32c"), ("rtx3090", "RTX 3090"), ("GeForce RTX 4090", "RTX 4090"),
    ("rtx 5090", "RTX 5090"), ("3060ti", "RTX 3060 Ti"), ("7950x", "Ryzen 9 7950X"), ("epyc-9654", "EPYC 9654"),
    ("h100", "H100 SXM5"), ("a100", "A100 80GB SXM4"),
])
def test_names_and_aliases_resolve_exactly(name, full):
    assert parse_hardware(name).name == full


def test_a_short_name_is_never_a_prefix_of_a_bigger_chip():
    # the newcomer finding: `m1` became the 800 GB/s M1 Ultra by prefix matching
    assert parse_hardware("m1").bandwidth == pytest.approx(68.25e9)
    assert parse_hardware("m4").bandwidth == pytest.approx(120e9)


@pytest.mark.parametrize("name,members", [
    ("rtx30", ["RTX 3060", "RTX 3090 Ti"]), ("rtx40", ["RTX 4060", "RTX 4090"]), ("m3 m", ["Apple M3 Max"]),
    ("core i9", ["Core i9-13900K", "Core i9-14900K"]),
])
def test_a_family_is_ambiguous_and_lists_its_members(name, members):
    with pytest.raises(ValueError, match="ambiguous") as e:
        parse_hardware(name)
    assert all(m in str(e.value) for m in members) and "did you mean" in str(e.value)


@pytest.mark.parametrize("name,guess", [("m4 ultra", "Apple M3 Ultra"), ("rtx 4095", "RTX 4090"),
                                        ("h2000", "H200 SXM")])
def test_unknown_names_suggest_close_ones(name, guess):
    with pytest.raises(ValueError, match="unknown hardware") as e:
        parse_hardware(name)
    assert "did you mean" in str(e.value) and guess in str(e.value)


def test_every_catalogue_row_has_numbers_and_a_source():
    rows = list(csv.DictReader(resources.files("verispec.plan").joinpath("hardware.csv").read_text().splitlines()))
    assert len(rows) == len(catalogue()) >= 60
    kinds = {r["kind"] for r in rows}
    assert kinds == {"gpu", "apple", "cpu", "tpu"}
    for r in rows:
        assert r["source"].strip() and float(r["memory_bandwidth_gb_s"]) > 0 and float(r["peak_tflops"]) > 0
    apple = {r["name"] for r in rows if r["kind"] == "apple"}
    for gen in ("M1", "M2", "M3", "M4"):
        assert {f"Apple {gen}", f"Apple {gen} Pro", f"Apple {gen} Max"} <= apple
    assert {"Apple M1 Ultra", "Apple M2 Ultra", "Apple M3 Ultra"} <= apple   # there is no M4 Ultra
    for series in ("30", "40", "50"):
        assert any(r["name"].startswith(f"RTX {series}") for r in rows)
    cpu = [catalogue()[r["name"]] for r in rows if r["kind"] == "cpu"]
    assert len(cpu) >= 8 and all(h.vector in ("avx2", "avx512", "neon") for h in cpu)


@pytest.mark.parametrize("name,preset", [
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3-8b"), ("llama3-8b", "llama-3-8b"), ("llama3.1:8b", "llama-3-8b"),
    ("llama3", "llama-3-8b"), ("llama3.2:1b", "llama-3.2-1b"), ("llama3.3:70b", "llama-3-70b"),
    ("qwen2.5:0.5b", "qwen2.5-0.5b"), ("Qwen/Qwen2.5-Coder-7B-Instruct", "qwen2.5-7b"),
    ("mlx-community/Qwen2.5-72B-Instruct-4bit", "qwen2.5-72b"), ("qwen2.5-7b-instruct-q4_k_m", "qwen2.5-7b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b"), ("Llama-3.1-8B-Instruct", "llama-3-8b"),
    ("t5-base", "t5-base"), ("Qwen/Qwen2.5-7B-Base", "qwen2.5-7b"),
])
def test_models_by_hf_id_ollama_name_and_preset(name, preset):
    assert get_preset(name).name == preset


def test_an_unknown_model_suggests_presets():
    with pytest.raises(ValueError, match="--target: unknown model 'llama-3-9b'.*did you mean llama-3-8b"):
        load_shape("llama-3-9b")


@pytest.mark.parametrize("dtype,bits", [("Q4_K_M", 4.9), ("IQ4_XS", 4.25), ("iq2_xxs", 2.06), ("Q8_0", 8.5),
                                        ("Q5_K_M", 5.7), ("Q6_K", 6.57), ("4bit", 4.5), ("Q4_K_L", 4.9)])
def test_gguf_dtypes_by_their_real_names(dtype, bits):
    assert dtype_bits(dtype) == pytest.approx(bits, abs=0.01)


def test_l_variants_store_the_head_in_q8_0():
    base, wide = load_shape("qwen2.5-32b", dtype="Q4_K_M"), load_shape("qwen2.5-32b", dtype="Q4_K_L")
    head = 152064 * 5120
    assert wide.weight_bytes - base.weight_bytes == pytest.approx(head * (8.5 - DTYPE_BITS["q4_k_m"]) / 8)
    assert set(HEAD_BITS) == {"q2_k_l", "q3_k_xl", "q4_k_l", "q5_k_l", "q6_k_l"}


def test_an_unknown_dtype_suggests_the_close_one():
    with pytest.raises(ValueError, match="--dtype: unknown dtype 'Q4_K_X'; did you mean"):
        load_shape("llama-2-7b", dtype="Q4_K_X")
