"""The planner's rooms: model sizes, hardware specs, the roofline, the plan itself."""

import json
import math
from pathlib import Path

import pytest

from verispec import registry
from verispec.plan import (
    Hardware,
    ModelShape,
    Stack,
    forward_time,
    get_preset,
    load_shape,
    parse_hardware,
    plan,
    preset_names,
    project_analysis,
    shape_from_config,
    shape_from_gguf,
)
from verispec.plan.planner import alpha_from_tau, break_even_alpha, ceiling
from verispec.plan.presets import preset_config
from verispec.theory import CostCurve, expected_tokens, speedup_constant_cost

# A model with round numbers: 1e9 weights multiplied per token, 2 bytes each.
SHAPE = ModelShape(name="round", n_layers=10, d_model=1000, n_heads=10, n_kv_heads=10, head_dim=100,
                   decode_params=1e9, total_params=1e9, weight_bytes=2e9, memory_bytes=2e9, dtype="bf16",
                   kv_bits=16)
BARE = Stack("bare")   # efficiencies 1, no overhead


# --------------------------------------------------------------------------- roofline


def test_memory_bound_forward_is_weights_plus_kv_over_bandwidth():
    hw = Hardware("mem-bound", bandwidth=1e12, flops=1e15)
    f = forward_time(SHAPE, hw, BARE, n=1, context=1000)
    # KV per token: 10 layers x 2 (K, V) x 10 heads x 100 dims x 2 bytes = 40,000 bytes
    assert f.memory_s == pytest.approx((2e9 + 1000 * 40_000) / 1e12)          # 2.04 ms
    # FLOPs: 2 x 1e9 + attention 4 x 10 layers x 10 heads x 100 x (1000 + 1) pairs
    assert f.compute_s == pytest.approx((2e9 + 4 * 10 * 10 * 100 * 1001) / 1e15)
    assert f.total_s == pytest.approx(f.memory_s) and f.bound == "memory"
    # more new tokens do not read the weights again: the same time at n = 8
    assert forward_time(SHAPE, hw, BARE, n=8, context=1000).total_s == pytest.approx(f.total_s)


def test_compute_bound_forward_is_flops_over_peak():
    hw = Hardware("compute-bound", bandwidth=1e15, flops=1e12)
    f = forward_time(SHAPE, hw, BARE, n=8, context=0)
    # 2 x 1e9 x 8 + attention over the 8 new tokens: 4 x 10 x 10 x 100 x (8 x 9 / 2)
    assert f.compute_s == pytest.approx((16e9 + 4 * 10 * 10 * 100 * 36) / 1e12)   # 16.0014 ms
    assert f.total_s == pytest.approx(f.compute_s) and f.bound == "compute"
    # compute-bound: cost grows linearly with n
    assert forward_time(SHAPE, hw, BARE, n=4).total_s == pytest.approx(f.total_s / 2, rel=1e-3)


def test_overhead_adds_in_series_or_overlaps():
    hw = Hardware("x", bandwidth=1e12, flops=1e15)
    serial = Stack("s", per_forward_s=1e-3, per_layer_s=1e-4)
    overlapped = Stack("o", per_forward_s=1e-3, per_layer_s=1e-4, overhead_overlaps=True)
    roof = forward_time(SHAPE, hw, BARE, 1).total_s                        # 2 ms
    assert forward_time(SHAPE, hw, serial, 1).total_s == pytest.approx(roof + 2e-3)
    assert forward_time(SHAPE, hw, overlapped, 1).total_s == pytest.approx(max(roof, 2e-3))
    slow_host = Stack("h", per_forward_s=5e-3, overhead_overlaps=True)
    f = forward_time(SHAPE, hw, slow_host, 1)
    assert f.total_s == pytest.approx(5e-3) and f.bound == "overhead"


def test_efficiencies_scale_the_ceilings():
    hw = Hardware("x", bandwidth=1e12, flops=1e15)
    half = Stack("half", bandwidth_efficiency=0.5)
    assert forward_time(SHAPE, hw, half, 1).total_s == pytest.approx(2 * forward_time(SHAPE, hw, BARE, 1).total_s)


def test_overlap_zero_adds_memory_and_compute():
    hw = Hardware("cpu-like", bandwidth=1e12, flops=1e12)
    f = forward_time(SHAPE, hw, Stack("sum", overlap=0.0), n=1)
    assert f.total_s == pytest.approx(f.memory_s + f.compute_s)          # 2 ms + 2 ms
    g = forward_time(SHAPE, hw, Stack("half", overlap=0.5), n=1)
    assert g.total_s == pytest.approx(max(g.memory_s, g.compute_s) + 0.5 * min(g.memory_s, g.compute_s))
    with pytest.raises(ValueError, match="overlap must be in"):
        Stack("bad", overlap=1.5)


def test_tensor_parallel_splits_bytes_and_adds_two_allreduces_per_layer():
    one = Hardware("x", bandwidth=1e12, flops=1e15, link_bandwidth=1e11)
    two = Hardware("x", bandwidth=1e12, flops=1e15, n_devices=2, link_bandwidth=1e11)
    stack = Stack("tp", allreduce_latency_s=5e-6)
    f1, f2 = forward_time(SHAPE, one, stack, 4), forward_time(SHAPE, two, stack, 4)
    assert f2.memory_s == pytest.approx(f1.memory_s / 2)
    payload = 4 * 1000 * 2                          # n x d_model x 2 bytes
    per = 5e-6 + 2 * (1 / 2) * payload / 1e11       # ring all-reduce on 2 devices
    assert f1.comm_s == 0 and f2.comm_s == pytest.approx(2 * 10 * per)
    assert f2.total_s == pytest.approx(f2.memory_s + f2.comm_s)


def test_forward_time_refuses_bad_arguments_by_name():
    hw = Hardware("x", bandwidth=1e12, flops=1e15)
    for kwargs, name in (({"n": 0}, "n"), ({"n": 1, "context": -1}, "context"), ({"n": 1, "batch": 0}, "batch")):
        with pytest.raises(ValueError, match=name):
            forward_time(SHAPE, hw, BARE, **kwargs)
    with pytest.raises(ValueError, match="--hardware.*flops"):
        forward_time(SHAPE, Hardware("no-peak", bandwidth=1e12), BARE, 1)


# --------------------------------------------------------------------------- model sizes


@pytest.mark.parametrize("name,billions", [
    ("llama-2-7b", 6.74), ("llama-2-13b", 13.0), ("llama-2-70b", 69.0), ("llama-3-8b", 8.03),
    ("llama-3-70b", 70.6), ("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.54), ("qwen2.5-7b", 7.62),
    ("qwen2.5-72b", 72.7), ("vicuna-33b", 32.5), ("vicuna-68m", 0.068), ("t5-small", 0.077),
    ("t5-base", 0.248), ("t5-large", 0.783), ("t5-xxl", 11.1)])
def test_presets_match_published_parameter_counts(name, billions):
    assert get_preset(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("name", preset_names())
def test_presets_round_trip_through_config_json(name, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(preset_config(name)))
    back, preset = shape_from_config(path), get_preset(name)
    for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "cross_attention"):
        assert getattr(back, field) == getattr(preset, field), field
    assert back.decode_params == preset.decode_params and back.memory_bytes == preset.memory_bytes


def test_preset_aliases_and_dtype_override():
    assert get_preset("meta-llama/Llama-2-7b-chat-hf").name == "llama-2-7b"
    assert get_preset("T5-XXL v1.1").name == "t5-xxl"
    assert get_preset("Qwen/Qwen2.5-Coder-7B-Instruct").name == "qwen2.5-7b"
    assert get_preset("no-such-model") is None
    int4 = load_shape("llama-2-70b", dtype="int4")
    assert int4.weight_bytes == pytest.approx(get_preset("llama-2-70b").weight_bytes * 4.5 / 16)
    assert load_shape("llama-2-7b", dtype="float32").kv_bits == 32


def test_config_json_parsing_handles_nesting_t5_and_refuses_moe():
    cfg = preset_config("qwen2.5-1.5b")
    nested = {"model_type": "gemma3", "text_config": cfg, "dtype": "bfloat16"}
    assert shape_from_config(nested).decode_params == get_preset("qwen2.5-1.5b").decode_params
    with pytest.raises(ValueError, match="mixture-of-experts"):
        shape_from_config({**cfg, "num_local_experts": 8})
    with pytest.raises(ValueError, match="config has none of num_attention_heads"):
        shape_from_config({"num_hidden_layers": 2})
    t5 = shape_from_config(preset_config("t5-small"))
    assert t5.cross_attention and t5.n_layers == 8


def _gguf_or_skip(name: str) -> Path:
    path = registry.gguf_path(name)
    if not path.exists():
        pytest.skip(f"{name} GGUF is not cached (verispec models fetch {name})")
    return path


@pytest.mark.parametrize("name,layers,heads,kv,head_dim,preset", [
    ("smollm2-135m", 30, 9, 3, 64, None),
    ("qwen2.5-coder-0.5b", 24, 14, 2, 64, "qwen2.5-0.5b"),
    ("qwen2.5-coder-1.5b", 28, 12, 2, 128, "qwen2.5-1.5b"),
])
def test_gguf_parsing_of_registered_models(name, layers, heads, kv, head_dim, preset):
    path = _gguf_or_skip(name)
    shape = shape_from_gguf(path)
    assert (shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim) == (layers, heads, kv, head_dim)
    assert shape.memory_bytes == pytest.approx(path.stat().st_size, rel=0.03)   # the rest: tokenizer metadata
    assert 4.0 < shape.bits_per_weight < 7.5                                    # 4-bit blocks, 6/8-bit head
    if preset:   # same architecture as the published model: same weights multiplied per token
        assert shape.decode_params == pytest.approx(get_preset(preset).decode_params, rel=0.002)
    assert load_shape(name).weight_bytes == shape.weight_bytes                  # registered name → its GGUF


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_config_json_of_converted_registered_models_agrees_with_the_gguf(name):
    hf = registry.hf_dir(name)
    if not (hf / "config.json").is_file():
        pytest.skip(f"{name} is not converted (verispec models fetch --convert {name})")
    from_cfg, from_gguf = shape_from_config(hf), shape_from_gguf(_gguf_or_skip(name))
    assert from_cfg.n_layers == from_gguf.n_layers and from_cfg.head_dim == from_gguf.head_dim
    assert from_cfg.decode_params == pytest.approx(from_gguf.decode_params, rel=0.002)
    assert from_cfg.dtype == "float32"


def test_load_shape_errors_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--draft: unknown model 'nope'"):
        load_shape("nope", flag="--draft")
    with pytest.raises(ValueError, match="--target: .*no GGUF"):
        load_shape(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="--target: .*not a readable GGUF"):
        load_shape(str(bad))
    with pytest.raises(ValueError, match="--dtype: unknown dtype .int3."):
        load_shape("llama-2-7b", dtype="int3")


# --------------------------------------------------------------------------- hardware


def test_hardware_catalogue_names_aliases_and_counts():
    h100 = parse_hardware("H100 SXM5")
    assert h100.bandwidth == 3350e9 and h100.flops == 989e12 and h100.memory == 80e9
    assert parse_hardware("h100") == h100
    assert parse_hardware("2xh100").n_devices == 2 and parse_hardware("h100x2").n_devices == 2
    four = parse_hardware("a100-80gb,n=4")
    assert four.n_devices == 4 and four.bandwidth == 2039e9 and four.link_bandwidth == 600e9
    assert parse_hardware("A100 80GB (330 W)".split(" (")[0]).name == "A100 80GB SXM4"


@pytest.mark.parametrize("spec,bw,flops,mem,n", [
    ("bw=2039GB/s,flops=312T,n=2", 2039e9, 312e12, None, 2),
    ("bw=2.039TB/s,flops=0.312P,mem=80GB", 2039e9, 312e12, 80e9, 1),
    ("bw=900,flops=125,mem=32", 900e9, 125e12, 32e9, 1),
    ("bw=100GiB/s,flops=5e12flops,mem=16GiB", 100 * 2**30, 5e12, 16 * 2**30, 1),
])
def test_hardware_spec_parsing(spec, bw, flops, mem, n):
    h = parse_hardware(spec)
    assert h.bandwidth == pytest.approx(bw) and h.flops == pytest.approx(flops) and h.n_devices == n
    assert (h.memory is None and mem is None) or h.memory == pytest.approx(mem)


@pytest.mark.parametrize("spec,match", [
    ("bw=fast,flops=1T", "cannot read bandwidth 'fast'"), ("flops=312T", "needs bw"),
    ("bw=1TB/s,flops=1T,color=red", "unknown key 'color'"), ("h100,n=0", "n must be an integer >= 1"),
    ("quantum-box", "unknown hardware 'quantum-box'"), ("a1", "ambiguous"), ("", "empty"),
])
def test_bad_hardware_specs_are_refused_by_name(spec, match):
    with pytest.raises(ValueError, match=f"--hardware: .*{match}"):
        parse_hardware(spec)


# --------------------------------------------------------------------------- the plan


def test_plan_on_a_flat_curve_reduces_to_leviathan_theorem_3_8():
    # a huge memory-bound target with no overhead: T_t(k+1) = T_t(1), so S(k) = E / (k c + 1)
    p = plan("llama-2-70b", "llama-2-7b", "bw=2TB/s,flops=100P,mem=1TB", alpha=0.8, stack=BARE, k_max=6, context=0)
    assert p.target_times[-1] == pytest.approx(p.target_times[0], rel=1e-3)
    assert p.c == pytest.approx(get_preset("llama-2-7b").weight_bytes / get_preset("llama-2-70b").weight_bytes,
                                rel=1e-3)
    for k in range(7):
        assert p.speedups[k] == pytest.approx(speedup_constant_cost(0.8, k, p.c), rel=2e-3)
        assert p.expected_tokens[k] == pytest.approx(expected_tokens(0.8, k))
    assert p.speedups[p.k_star] == max(p.speedups) and p.speedup_star == max(p.speedups)


def test_break_even_alpha_and_ceiling_are_consistent():
    p = plan("qwen2.5-7b", "qwen2.5-0.5b", "rtx4090", alpha=0.5, k_max=6)
    be = p.break_even_alpha
    assert be is not None and 0 < be < 1
    curve = p.cost_curve
    assert max(curve.speedup(be + 1e-3, k) for k in range(1, 7)) > 1
    assert max(curve.speedup(be - 1e-3, k) for k in range(1, 7)) < 1
    k_c, s = ceiling(curve, 6)
    assert s == pytest.approx(max(curve.speedup(1.0, kk) for kk in range(7))) and p.ceiling_speedup == s
    assert curve.speedup(1.0, k_c) == s and p.ceiling_k == k_c


def test_no_break_even_when_verification_is_compute_bound():
    # a compute-bound machine where each extra token costs a full forward and the draft is not free
    curve = CostCurve(tuple(float(n) for n in range(1, 10)), 0.2)
    assert break_even_alpha(curve, 8) is None


def test_alpha_from_tau_inverts_expected_tokens():
    a = alpha_from_tau(2.5, 4)
    assert expected_tokens(a, 4) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="--tau must be in"):
        alpha_from_tau(6.0, 4)
    p = plan("qwen2.5-7b", "qwen2.5-0.5b", "h100", tau=2.5, tau_k=4)
    assert p.alpha == pytest.approx(a)


@pytest.mark.parametrize("kwargs,match", [
    (dict(alpha=1.0), "--alpha must be in \\(0, 1\\)"), (dict(alpha=0.0), "--alpha must be in"),
    (dict(alpha=-0.2), "--alpha must be in"), (dict(alpha=float("nan")), "--alpha must be in"),
    (dict(alpha=0.7, k_max=0), "--k-max"), (dict(alpha=0.7, context=-1), "--context"),
    (dict(alpha=0.7, batch=0), "--batch"), (dict(alpha=0.7, dtype="int3"), "--dtype: unknown dtype 'int3'"),
    (dict(alpha=0.7, tau=2.0), "exactly one of"), (dict(), "exactly one of"),
])
def test_plan_refuses_what_it_cannot_model(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan("llama-2-7b", "vicuna-68m", "a100-80gb", **kwargs)


def test_plan_refuses_a_model_larger_than_device_memory():
    with pytest.raises(ValueError, match="--target llama-2-70b .* needs 1[45][0-9].* GB .*--hardware A100 80GB SXM4 "
                                         "holds 80.0 GB"):
        plan("llama-2-70b", "llama-2-7b", "a100-80gb", alpha=0.7)
    assert plan("llama-2-70b", "llama-2-7b", "a100-80gb,n=2", alpha=0.7).k_star > 0   # fits on two
    assert plan("llama-2-70b", "llama-2-7b", "a100-80gb", alpha=0.7, dtype="int4").k_star > 0   # or in int4


def test_plan_as_dict_is_json_ready():
    d = plan("llama-3-8b", "llama-3.2-1b", "l4", alpha=0.7, k_max=4).as_dict()
    again = json.loads(json.dumps(d))
    assert again["k_star"] == d["k_star"] and len(again["target_times"]) == 5 and again["target_ratios"][0] == 1
    assert again["hardware"]["name"] == "L4" and again["stack"]["name"] == "compiled"


def test_project_analysis_uses_the_measured_per_position_alpha():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "analysis-llamacpp" / "analysis.json"
    data = json.loads(path.read_text())
    p = project_analysis(data, "h100", target="qwen2.5-1.5b", draft="qwen2.5-0.5b")
    measured = data["overall"]["alphas"]
    assert p.alphas == pytest.approx(measured[:p.k_max])
    assert p.k_max == data["k_max"] and p.context == data["cost_curve"]["prefix_tokens"]
    assert any("measured where the analysis ran" in note for note in p.notes)
    assert p.speedups[1] == pytest.approx(p.cost_curve.speedup(measured[:1], 1))
    with pytest.raises(ValueError, match="--alpha-from: .*no per-position α for 'poetry'"):
        project_analysis(data, "h100", category="poetry", target="qwen2.5-1.5b", draft="qwen2.5-0.5b")
    assert math.isfinite(p.speedup_star)


def test_gguf_header_reader_agrees_with_gguf_package(tmp_path):
    """A small GGUF written with gguf.GGUFWriter: our struct walk and GGUFReader see the same."""
    import numpy as np
    from gguf import GGUFReader, GGUFWriter

    path = tmp_path / "tiny.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_token_list([f"tok{i}" for i in range(3000)])      # a long string array, skipped
    w.add_file_type(1)                                       # MOSTLY_F16
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": (100, 64), "output.weight": (100, 64)}
    for b in range(2):
        for part, shp in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)), ("attn_output", (64, 64)),
                          ("ffn_gate", (128, 64)), ("ffn_up", (128, 64)), ("ffn_down", (64, 128))):
            tensors[f"blk.{b}.{part}.weight"] = shp
    for name, shp in tensors.items():
        w.add_tensor(name, rng.standard_normal(shp).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    shape = shape_from_gguf(path)
    reader = GGUFReader(str(path))
    assert shape.memory_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    blk = sum(int(t.n_elements) for t in reader.tensors if t.name.startswith("blk.") or t.name == "output.weight")
    assert shape.decode_params == blk == 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64) + 100 * 64
    assert shape.weight_bytes == 2 * blk and shape.bits_per_weight == 16
    assert (shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim) == (2, 4, 2, 16)
    assert shape.dtype == "MOSTLY_F16"


def test_fit_recovers_a_known_stack_from_curves_it_generated():
    from verispec.plan.fit import LOCAL_PARAMS, fit_stack
    from verispec.plan.shapes import shape_from_dims

    hw = Hardware("cpu", bandwidth=20e9, flops=200e9)
    truth = Stack("truth", per_forward_s=2e-3, per_layer_s=1e-4, bandwidth_efficiency=0.6,
                  compute_efficiency=0.4, overlap=0.3)
    small = shape_from_dims("a", n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536, vocab=49152, dtype="fp32")
    mid = shape_from_dims("b", n_layers=24, d_model=896, n_heads=14, n_kv_heads=2, d_ff=4864, vocab=151936, dtype="fp32")
    curves = [(s, [forward_time(s, hw, truth, n, 200).total_s for n in range(1, 13)]) for s in (small, mid)]
    fitted = fit_stack(curves, hw, context=200, params=LOCAL_PARAMS)
    big = shape_from_dims("c", n_layers=28, d_model=1536, n_heads=12, n_kv_heads=2, d_ff=8960, vocab=151936, dtype="fp32")
    for n in (1, 4, 8):   # the fit predicts a third model it never saw
        assert forward_time(big, hw, fitted, n, 200).total_s == pytest.approx(
            forward_time(big, hw, truth, n, 200).total_s, rel=0.02)
    assert "RMS log error" in fitted.source
    assert fitted.sigma_log_time < 0.02 and fitted.sigma_log_ratio < 0.02     # exact curves: no scatter left
    # a curve with a 20 % bump at one n leaves scatter for the intervals to widen with
    bumped = [(shape, [t * (1.2 if n == 6 else 1.0) for n, t in enumerate(times, 1)]) for shape, times in curves]
    noisy = fit_stack(bumped, hw, context=200, params=LOCAL_PARAMS)
    assert 0.03 < noisy.sigma_log_ratio < 0.2 and noisy.sigma_log_time > 0.02
    with pytest.raises(ValueError, match="params must be"):
        fit_stack(curves, hw, context=200, params=("warp",))


def test_calibrate_fits_a_stack_to_a_real_models_curve():
    """--hardware local --calibrate: time SmolLM2-135M (transformers) and fit this machine's stack."""
    if not (registry.hf_dir("smollm2-135m") / "config.json").is_file():
        pytest.skip("smollm2-135m is not converted (verispec models fetch --convert smollm2-135m)")
    from verispec.plan.fit import calibrate

    hw = Hardware("cpu", bandwidth=10e9, flops=100e9)   # fixed ceilings: no micro-benchmark in a test
    stack, raw = calibrate(["smollm2-135m"], "transformers", hw, context=16, n_max=3, repeats=1)
    assert len(raw["curves"]["smollm2-135m"]) == 3 and all(t > 0 for t in raw["curves"]["smollm2-135m"])
    assert stack.name == "transformers@local" and stack.per_layer_s == 0.0   # one model: one overhead
    assert "fitted to smollm2-135m" in stack.source
    p = plan("qwen2.5-1.5b", "qwen2.5-0.5b", hw, alpha=0.7, stack=stack, dtype="float32", k_max=3)
    assert p.stack is stack and len(p.target_times) == 4


def test_calibrate_clock_is_checked_before_any_model_loads():
    from verispec.plan.fit import calibrate

    hw = Hardware("cpu", bandwidth=20e9, flops=200e9)
    with pytest.raises(ValueError, match="--calibrate-clock thread needs --backend llamacpp"):
        calibrate(["smollm2-135m"], "transformers", hw, clock="thread")
    with pytest.raises(ValueError, match="--calibrate-clock must be wall or thread"):
        calibrate(["smollm2-135m"], "llamacpp", hw, clock="sundial")
