"""The vllm backend's weight arithmetic on CPU, and its engine path where vLLM and a GPU exist.

The ES worker extension (runner/backends/vllm_extension.py) is driven here through a
stand-in worker whose ``model_runner.model`` is a hand-built copy of a tiny HF Qwen2 model
laid out as vLLM's Qwen2 lays it out: fused ``qkv_proj`` / ``gate_up_proj`` (weights and
biases), the embedding (and an untied head) padded to a multiple of 64 rows, a tied head
sharing the embedding's tensor. The fused copy is built by hand below, independently of
the name map it checks.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import importlib
import importlib.util
import json
import random
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import runner.es
from runner.backends import GenerationRequest, SessionBatcher, make_backend
from runner.backends.batching import BatcherClosed
from runner.backends.context import chat_ids
from runner.backends.vllm import (
    EngineOptions,
    VLLMUnavailable,
    engine_args,
    generation_record,
)
from runner.backends.vllm_extension import ESWorkerExtension, weights_checksum
from runner.backends.vllm_names import build_name_map, fuse, padding_rows
from runner.es import ESOptimizer, UpdateRule
from runner.models import build_tiny_model, load_tiny_model

REPO = Path(__file__).resolve().parents[2]
PAD = 64  # vLLM's default vocabulary padding
SENTINEL = 7.0  # padding rows hold this; nothing may ever write them
ES = {"sigma": 0.01, "alpha": 0.5}


def _vllm_importable() -> str | None:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        return f"vLLM is not importable here ({exc}); the engine path runs on a GPU machine"
    if not torch.cuda.is_available():
        return "no CUDA GPU here; the vLLM engine path needs one"
    return None


# -- a hand-built vLLM-layout copy of a HF Qwen2 model ---------------------------------
class _W(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
        if bias is not None:
            self.bias = torch.nn.Parameter(bias.detach().clone(), requires_grad=False)


def _padded(w: torch.Tensor) -> torch.Tensor:
    rows = -(-w.shape[0] // PAD) * PAD
    out = torch.full((rows, *w.shape[1:]), SENTINEL, dtype=w.dtype)
    out[: w.shape[0]] = w
    return out


class FusedQwen2(torch.nn.Module):
    """vLLM's Qwen2ForCausalLM parameter layout (tensor parallel 1), built from a HF model."""

    packed_modules_mapping = {  # as vLLM's class declares it
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, hf: torch.nn.Module) -> None:
        super().__init__()
        sd = {k: v for k, v in hf.state_dict().items()}
        n_layers = hf.config.num_hidden_layers
        self.model = torch.nn.Module()
        self.model.embed_tokens = _W(_padded(sd["model.embed_tokens.weight"]))
        layers = []
        for i in range(n_layers):
            p = f"model.layers.{i}."
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            a = p + "self_attn."
            layer.self_attn.qkv_proj = _W(
                torch.cat([sd[a + f"{x}_proj.weight"] for x in "qkv"]),
                torch.cat([sd[a + f"{x}_proj.bias"] for x in "qkv"]),
            )
            layer.self_attn.o_proj = _W(sd[a + "o_proj.weight"])
            layer.mlp = torch.nn.Module()
            m = p + "mlp."
            layer.mlp.gate_up_proj = _W(
                torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]])
            )
            layer.mlp.down_proj = _W(sd[m + "down_proj.weight"])
            layer.input_layernorm = _W(sd[p + "input_layernorm.weight"])
            layer.post_attention_layernorm = _W(sd[p + "post_attention_layernorm.weight"])
            layers.append(layer)
        self.model.layers = torch.nn.ModuleList(layers)
        self.model.norm = _W(sd["model.norm.weight"])
        if hf.config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens  # one tensor, as vLLM ties it
        else:
            self.lm_head = _W(_padded(sd["lm_head.weight"]))


def tensors_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in module.named_parameters()}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bitwise(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    a, e = tensors_of(actual), tensors_of(expected)
    assert list(a) == list(e)
    for name in a:
        assert torch.equal(bits(a[name]), bits(e[name])), name


def stand_in(fused: torch.nn.Module) -> ESWorkerExtension:
    """vLLM's worker as far as the extension sees it: ``model_runner.model``."""

    class Worker(ESWorkerExtension):
        pass

    w = Worker()
    w.model_runner = SimpleNamespace(model=fused)
    return w


def hf_shapes(model: torch.nn.Module) -> list[list]:
    return [[n, list(p.shape)] for n, p in model.named_parameters()]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-ext")
    return {
        # tied head, 500-token vocabulary: 12 padding rows
        "tied": build_tiny_model(root / "tied", seed=0, vocab_size=500),
        # separate head, 450 tokens: 62 padding rows in the embedding and in the head
        "untied": build_tiny_model(
            root / "untied", seed=1, vocab_size=450, tie_word_embeddings=False
        ),
    }


# -- the name map -----------------------------------------------------------------------
def test_name_map_places_each_hf_parameter_in_its_fused_rows(models):
    hf, _ = load_tiny_model(models["tied"])
    fused = FusedQwen2(hf)
    shapes = {n: tuple(p.shape) for n, p in fused.named_parameters()}  # the tie listed once
    pieces = build_name_map(hf_shapes(hf), shapes, FusedQwen2.packed_modules_mapping)
    by_hf = {p.hf_name: p for p in pieces}
    assert [p.hf_name for p in pieces] == [n for n, _ in hf.named_parameters()]
    a = "model.layers.1.self_attn."
    q, k, v = (by_hf[a + f"{x}_proj.weight"] for x in "qkv")
    assert (q.vllm_name, q.start, q.stop) == (a + "qkv_proj.weight", 0, 64)
    assert (k.start, k.stop, v.start, v.stop) == (64, 96, 96, 128)
    assert by_hf[a + "v_proj.bias"].vllm_name == a + "qkv_proj.bias"
    up = by_hf["model.layers.0.mlp.up_proj.weight"]
    assert (up.vllm_name, up.start, up.stop) == ("model.layers.0.mlp.gate_up_proj.weight", 128, 256)
    emb = by_hf["model.embed_tokens.weight"]
    assert (emb.start, emb.stop) == (0, 500) and shapes[emb.vllm_name][0] == 512
    assert "lm_head.weight" not in by_hf  # tied: one tensor, perturbed once
    assert padding_rows(pieces, shapes) == 12
    # fuse() (HF -> vLLM layout) reproduces the hand-built copy
    rebuilt = fuse(dict(hf.named_parameters()), pieces, shapes, fill=SENTINEL)
    assert all(torch.equal(rebuilt[n], t) for n, t in tensors_of(fused).items())


def test_name_map_refuses_what_it_cannot_place(models):
    hf, _ = load_tiny_model(models["untied"])
    shapes = {n: tuple(p.shape) for n, p in FusedQwen2(hf).named_parameters()}
    good = hf_shapes(hf)
    assert padding_rows(build_name_map(good, shapes), shapes) == 62 * 2
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    with pytest.raises(
        ValueError, match="qkv_proj.weight.* has 64 rows.* have 128 .tensor parallel"
    ):
        build_name_map(good, {**shapes, qkv: (64, 64)})  # a TP shard of it
    with pytest.raises(ValueError, match="no HF counterpart.*rotary"):
        build_name_map(good, {**shapes, "model.rotary.weight": (4,)})
    with pytest.raises(ValueError, match="o_proj.weight.*has no vLLM tensor"):
        build_name_map(
            good, {k: v for k, v in shapes.items() if "layers.1.self_attn.o_proj" not in k}
        )
    with pytest.raises(ValueError, match="lm_head.weight.*neither equal nor padded"):
        build_name_map(good, {**shapes, "lm_head.weight": (448, 64)})


# -- the extension's arithmetic against the hf model ------------------------------------
# Every noise scheme the ES core has (the extension passes ``noise`` through untouched).
SCHEMES = [{"noise": s} for s in getattr(runner.es, "NOISE_SCHEMES", ())] or [{}]


@pytest.mark.parametrize("variant", ["tied", "untied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("noise", SCHEMES, ids=lambda n: n.get("noise", "default"))
def test_extension_perturbs_restores_and_updates_exactly_like_the_hf_model(
    models, variant, dtype, noise
):
    es = {**ES, **noise}
    hf, _ = load_tiny_model(models[variant], dtype=dtype)
    ref = copy.deepcopy(hf)  # the HF side: ESOptimizer on the HF module itself
    ref_opt = ESOptimizer(ref, **es)
    fused = FusedQwen2(hf)
    original = copy.deepcopy(fused)
    worker = stand_in(fused)
    info = worker.es_setup(hf_shapes(hf), es)
    # the weights hash runs over HF names in HF order: the hf backend's base hash
    assert info["base_hash"] == ref_opt.base_hash
    assert info["es_config"] == ref_opt.config()
    assert info["padding_rows"] == (12 if variant == "tied" else 124)
    assert info["tied_aliases"] == (["lm_head.weight"] if variant == "tied" else [])
    base_sum = worker.es_checksum()

    for seed, sign in ((11, 1), (12, -1)):
        worker.es_perturb(seed, sign)
        with ref_opt.perturbed(seed, sign):
            assert_bitwise(fused, FusedQwen2(ref))  # same noise on every fused row range
            assert worker.es_weights_hash() == ref_opt.weights_hash()
        assert worker.es_checksum() != base_sum
        worker.es_restore()
        assert_bitwise(fused, original)  # restore: bit for bit, padding untouched
        assert worker.es_checksum() == base_sum

    # an update log made with no model at all (as the orchestrator makes it) ...
    rule = UpdateRule(**ES)
    log = [rule.make([(1, 1.0, 0), (2, 0.0, 0), (3, 0.25, 0)], 0)]
    log.append(rule.make([(4, 0.5, 1), (5, 2.0, 0)], 1))
    if noise and "noise" in {f.name for f in dataclasses.fields(log[1])}:
        log[1] = dataclasses.replace(log[1], noise=noise["noise"])  # as an optimizer names it
    assert worker.es_replay([r.to_dict() for r in log], 2) == 2 == worker.es_version()
    ref_opt.replay(log)
    assert_bitwise(fused, FusedQwen2(ref))  # ... lands on the same weights as on HF
    assert worker.es_weights_hash() == ref_opt.weights_hash()
    masters = dict(worker._es().opt.master_parameters())
    for name, m in ref_opt.master_parameters():
        assert torch.equal(bits(masters[name]), bits(m)), name
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # padding never written
        if name in tensors_of(fused):
            assert (tensors_of(fused)[name][hf.config.vocab_size :] == SENTINEL).all()

    # after the update, a perturbation still matches and a restore returns the updated weights
    updated = copy.deepcopy(fused)
    worker.es_perturb(99)
    with ref_opt.perturbed(99):
        assert_bitwise(fused, FusedQwen2(ref))
    worker.es_restore()
    assert_bitwise(fused, updated)
    assert worker.es_self_test(5)["ok"]
    assert_bitwise(fused, updated)
    assert worker.es_close()


def test_extension_refuses_nesting_and_replay_while_perturbed(models):
    hf, _ = load_tiny_model(models["tied"])
    worker = stand_in(FusedQwen2(hf))
    worker.es_setup(hf_shapes(hf), ES)
    worker.es_perturb(1)
    with pytest.raises(RuntimeError, match="do not nest"):
        worker.es_perturb(2)
    with pytest.raises(RuntimeError, match="while perturbed"):
        worker.es_replay([], 0)
    worker.es_restore()
    worker.es_restore()  # a second restore is a no-op
    fresh = stand_in(FusedQwen2(hf))
    with pytest.raises(RuntimeError, match="es_setup has not run"):
        fresh.es_perturb(1)


def test_an_hf_backend_replays_the_log_of_a_vllm_worker(models):
    """The log a vLLM worker commits replays on the hf backend to the same weights."""
    path = models["tied"]
    hf, _ = load_tiny_model(path)
    worker = stand_in(FusedQwen2(hf))
    worker.es_setup(hf_shapes(hf), ES)
    rule = UpdateRule(**ES)
    log = [rule.make([(7, 1.0, 0), (8, -1.0, 0)], 0), rule.make([(9, 0.3, 1), (10, 0.1, 1)], 1)]
    worker.es_replay([r.to_dict() for r in log], 2)
    backend = make_backend("hf", path=str(path), es=ES, max_new_tokens=4, context_tokens=64)
    try:
        assert backend.base_hash == worker.es_info()["base_hash"]
        assert backend.sync(log) == 2
        assert backend.weights_hash() == worker.es_weights_hash()
    finally:
        backend.close()


def test_checksum_sees_one_changed_element_and_moved_elements():
    a = {"x": torch.randn(1000, dtype=torch.bfloat16), "y": torch.randn(7)}
    base = weights_checksum(a.items())
    b = {k: v.clone() for k, v in a.items()}
    b["x"][500] = b["x"][500] + 1
    assert weights_checksum(b.items()) != base
    c = {k: v.clone() for k, v in a.items()}
    c["y"] = c["y"].flip(0)
    assert weights_checksum(c.items()) != base
    assert weights_checksum({k: v.clone() for k, v in a.items()}.items()) == base


def test_inference_tensors_are_refused_with_a_reason(models):
    hf, _ = load_tiny_model(models["tied"])
    with torch.inference_mode():
        fused = FusedQwen2(hf)
    with pytest.raises(RuntimeError, match="inference tensors"):
        stand_in(fused).es_setup(hf_shapes(hf), ES)


# -- the backend's pieces that need no engine -------------------------------------------
def test_a_completion_becomes_the_hf_backends_generation_record():
    eos = {3}
    g = generation_record("ls</command>", [5, 6, 7], "stop", "</command>", 10, False, eos)
    assert (g.finish, g.tokens_out, g.text) == ("stop", 3, "ls</command>")
    g = generation_record("ls", [5, 6, 3], "stop", 3, 10, True, eos)  # eos as a stop id
    assert (g.finish, g.tokens_out, g.truncated) == ("eos", 2, True)
    g = generation_record("ls", [5, 6, 3], "stop", None, 10, False, eos)  # the model's eos
    assert (g.finish, g.tokens_out) == ("eos", 2)
    g = generation_record("lsls", [5, 6, 5, 6], "length", None, 10, False, eos)
    assert (g.finish, g.tokens_out) == ("length", 4)


def test_engine_options_prefix_caching_is_off_unless_reset_is_asked_for(tmp_path):
    args = engine_args(tmp_path, dtype="bfloat16", max_model_len=4096, options=EngineOptions())
    assert args["enable_prefix_caching"] is False
    assert args["worker_extension_cls"] == "runner.backends.vllm_extension.ESWorkerExtension"
    assert args["tensor_parallel_size"] == 1 and args["max_model_len"] == 4096
    reset = EngineOptions.from_mapping({"prefix_cache": "reset", "extra": {"block_size": 32}})
    args = engine_args(tmp_path, dtype="bfloat16", max_model_len=4096, options=reset)
    assert args["enable_prefix_caching"] is True and args["block_size"] == 32
    with pytest.raises(ValueError, match="prefix_cache"):
        EngineOptions.from_mapping({"prefix_cache": "on"})
    with pytest.raises(ValueError, match="unknown vLLM engine option"):
        EngineOptions.from_mapping({"prefix_caching": "off"})
    with pytest.raises(ValueError, match="may not set"):
        engine_args(tmp_path, dtype="bfloat16", max_model_len=64,
                    options=EngineOptions(extra={"worker_extension_cls": "x.Y"}))  # fmt: skip


class _WorkerBase:
    """vLLM's worker class, before the extension is added to its bases."""


class _FakeAsyncLLM:
    """vLLM's AsyncLLM as far as the backend uses it, on CPU: the worker is the real
    extension mixed into a worker class over a hand-fused copy of the model; RPC arguments
    and results go through JSON, as they cross a process boundary in vLLM (msgpack)."""

    last: _FakeAsyncLLM | None = None

    def __init__(self, args: SimpleNamespace) -> None:
        module, _, cls = args.worker_extension_cls.rpartition(".")
        ext = getattr(importlib.import_module(module), cls)
        worker = type("Worker", (_WorkerBase, ext), {})()  # as vLLM mixes the extension in
        hf, _ = load_tiny_model(args.model, dtype=getattr(torch, args.dtype))
        worker.model_runner = SimpleNamespace(model=FusedQwen2(hf))
        self.args, self.worker = args, worker
        self.rpcs: list[str] = []
        self.requests: list[tuple[list[int], Any]] = []
        self.resets = 0
        self.shut = False
        _FakeAsyncLLM.last = self

    @classmethod
    def from_engine_args(cls, args):
        return cls(args)

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append(method)
        args = json.loads(json.dumps(list(args)))
        return [json.loads(json.dumps(getattr(self.worker, method)(*args, **(kwargs or {}))))]

    async def reset_prefix_cache(self):
        self.resets += 1
        return True

    async def generate(self, prompt, params, request_id):
        ids = list(prompt["prompt_token_ids"])
        self.requests.append((ids, params))
        await asyncio.sleep(params.seed % 5 / 100)  # replies finish out of order
        rng = random.Random(params.seed)
        tokens = [rng.randrange(10, 400) for _ in range(params.max_tokens)]
        yield SimpleNamespace(
            finished=True,
            outputs=[SimpleNamespace(text=" ".join(map(str, tokens)), token_ids=tokens,
                                     finish_reason="length", stop_reason=None)],
        )  # fmt: skip

    def shutdown(self):
        self.shut = True


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` package (the modules and names the backend imports)."""

    def module(name: str, **attrs) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    module("vllm", SamplingParams=lambda **kw: SimpleNamespace(**kw), __version__="0.0-fake")
    module("vllm.engine")
    module("vllm.engine.arg_utils", AsyncEngineArgs=lambda **kw: SimpleNamespace(**kw))
    module("vllm.inputs", TokensPrompt=lambda **kw: dict(kw))
    module("vllm.sampling_params", RequestOutputKind=SimpleNamespace(FINAL_ONLY="final"))
    module("vllm.v1")
    module("vllm.v1.engine")
    module("vllm.v1.engine.async_llm", AsyncLLM=_FakeAsyncLLM)
    return _FakeAsyncLLM


def test_the_backend_drives_the_engine_through_named_rpcs(models, fake_vllm):
    """The backend's driver side on CPU, against a fake engine holding the real extension."""
    path = models["tied"]
    backend = make_backend(
        "vllm", path=str(path), dtype="float32", device="cuda", es=ES, temperature=0.7,
        max_new_tokens=5, context_tokens=128, stop=("</command>",),
        engine={"prefix_cache": "reset", "gpu_memory_utilization": 0.4},
    )  # fmt: skip
    engine = fake_vllm.last
    try:
        args = engine.args
        assert args.worker_extension_cls == "runner.backends.vllm_extension.ESWorkerExtension"
        assert args.enable_prefix_caching is True and args.max_model_len == 128
        assert args.gpu_memory_utilization == 0.4 and args.dtype == "float32"
        assert engine.rpcs == ["es_setup", "es_self_test"]  # the start-up self-test ran
        assert backend.self_test_result["ok"] and engine.resets == 1
        hf, _ = load_tiny_model(path)
        ref = ESOptimizer(hf, **ES)
        assert backend.base_hash == ref.base_hash and backend.es_config() == ref.config()
        with backend.perturbed(5), ref.perturbed(5):
            assert backend.weights_hash() == ref.weights_hash()
        assert backend.weights_hash() == ref.base_hash
        rule = UpdateRule(**ES)
        log = [rule.make([(1, 1.0, 0), (2, 0.0, 0)], 0), rule.make([(3, 0.2, 1), (4, 1.0, 1)], 1)]
        assert backend.sync(log[:1]) == 1 and backend.sync(log) == 1 and backend.sync(log) == 0
        ref.replay(log)
        assert backend.version == 2 and backend.weights_hash() == ref.weights_hash()
        assert engine.resets == 1 + 2 + 2  # self-test, perturb + restore, two syncs

        # generation: every request submitted at once, each with its own seed
        msgs = [{"role": "user", "content": "list files"}]
        reqs = [GenerationRequest(msgs, seed=s) for s in (3, 1, 3)]
        out = backend.generate(reqs)
        assert out[0] == out[2] and out[0].text != out[1].text  # one seed, one stream
        assert all(g.tokens_in == len(chat_ids(backend.tokenizer, msgs)) for g in out)
        assert all(g.finish == "length" and g.tokens_out == 5 for g in out)
        ids, params = engine.requests[0]
        assert ids == chat_ids(backend.tokenizer, msgs) and params.seed in (1, 3)
        assert params.stop == ["</command>"] and params.include_stop_str_in_output
        assert params.output_kind == "final" and params.temperature == 0.7
        assert set(params.stop_token_ids) == {backend.tokenizer.eos_token_id}

        # weights never change under a running generation
        slow = backend.submit(GenerationRequest(msgs, seed=4))  # 40 ms in the fake engine
        with pytest.raises(RuntimeError, match="in flight"):
            backend.sync([*log, rule.make([(5, 1.0, 2), (6, 0.0, 2)], 2)])
        assert slow.result(timeout=10).tokens_out == 5
        # through the session batcher: straight to the engine
        batcher = SessionBatcher(backend, window_s=5.0)
        t0 = time.monotonic()
        assert batcher.generate(GenerationRequest(msgs, seed=1)) == out[1]
        assert time.monotonic() - t0 < 2.0  # no 5 s batching window
        batcher.close()
    finally:
        backend.close()
    assert engine.rpcs[-1] == "es_close" and engine.shut
    backend.close()  # idempotent


def test_run_config_takes_backend_vllm_on_a_gpu_only():
    import yaml

    from runner.config import validate_run
    from staleness_sim.config import ConfigError

    data = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    data["model"].update(backend="vllm", device="cuda:1", vllm={"prefix_cache": "reset"})
    model = validate_run(data).model
    assert model.backend == "vllm" and model.vllm.prefix_cache == "reset"
    assert EngineOptions.from_mapping(model.vllm.model_dump()).prefix_cache == "reset"
    for change, message in (
        ({"device": "cpu"}, "model: backend vllm runs on a GPU"),
        ({"vllm": {"prefix_cache": "on"}}, "model.vllm.prefix_cache"),
        ({"vllm": {"gpu_memory_utilization": 1.5}}, "model.vllm.gpu_memory_utilization"),
    ):
        bad = {**data, "model": {**data["model"], **change}}
        with pytest.raises(ConfigError, match=message):
            validate_run(bad)


def test_nothing_imports_vllm_until_a_vllm_backend_is_built():
    code = (
        "import sys, runner.backends, runner.backends.vllm, runner.backends.vllm_extension, "
        "runner.backends.vllm_names, runner.workers; "
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_vllm_the_backend_says_what_to_install(models):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the message is not shown")
    with pytest.raises(VLLMUnavailable) as err:
        make_backend("vllm", path=str(models["tied"]), device="cuda")
    message = str(err.value)
    assert "\n" not in message and "pip install -e .[vllm]" in message


def test_a_failed_engine_start_leaves_no_thread_behind(models, fake_vllm, monkeypatch):
    def broken(args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(fake_vllm, "from_engine_args", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        make_backend("vllm", path=str(models["tied"]), device="cuda", stop=())
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name == "vllm-loop"]


# -- the session batcher's pass-through for a continuously batching backend -------------
class _Engine:
    """A fake continuous-batching backend: each turn finishes after its own delay."""

    continuous_batching = True

    def __init__(self) -> None:
        self.submitted: list[tuple[float, int]] = []
        self.cancelled = 0

    def submit(self, request: GenerationRequest) -> Future:
        fut: Future = Future()
        self.submitted.append((time.monotonic(), request.seed))
        delay = request.seed / 10

        def finish() -> None:
            time.sleep(delay)
            if fut.set_running_or_notify_cancel():
                fut.set_result(f"reply {request.seed}")
            else:
                self.cancelled += 1

        threading.Thread(target=finish, daemon=True).start()
        return fut


def test_batcher_hands_each_turn_to_a_continuous_backend_at_once():
    engine = _Engine()
    batcher = SessionBatcher(engine, max_batch=64, window_s=10.0)  # window would be 10 s
    t0 = time.monotonic()
    quick = batcher.submit(GenerationRequest([], seed=1))
    slow = batcher.submit(GenerationRequest([], seed=6))
    assert quick.result(timeout=5) == "reply 1"
    assert time.monotonic() - t0 < 0.5 and not slow.done()  # no turn barrier, no window
    # the quick session's next turn goes in while the slow one is still running
    again = batcher.submit(GenerationRequest([], seed=2))
    assert again.result(timeout=5) == "reply 2" and not slow.done()
    assert len(engine.submitted) == 3 and batcher.batch_sizes == []
    batcher.close()  # the slow turn is cancelled in the engine
    with pytest.raises(BatcherClosed):
        slow.result(timeout=5)
    with pytest.raises(BatcherClosed):
        batcher.submit(GenerationRequest([], seed=3))


# -- the engine itself (GPU machines with vLLM) -----------------------------------------
@pytest.mark.vllm
@pytest.mark.skipif(_vllm_importable() is not None, reason=str(_vllm_importable()))
def test_vllm_engine_self_test_hash_and_perturbation_match_the_hf_backend(tmp_path):
    # head size 64 (every vLLM attention backend takes it), 500 tokens: 12 padding rows
    path = str(build_tiny_model(tmp_path / "m", seed=0, vocab_size=500, hidden_size=256,
                                num_heads=4, num_kv_heads=2, intermediate_size=512))  # fmt: skip
    common = {"path": path, "dtype": "bfloat16", "device": "cuda", "es": ES,
              "max_new_tokens": 16, "context_tokens": 256, "stop": ()}  # fmt: skip
    engine = {"gpu_memory_utilization": 0.2, "enforce_eager": True}
    backend = make_backend("vllm", engine=engine, **common)
    hf = make_backend("hf", **common)
    try:
        assert backend.self_test_result["ok"]  # the start-up self-test ran and passed
        assert backend.base_hash == hf.base_hash  # the name map fits the real engine
        with backend.perturbed(21), hf.perturbed(21):
            assert backend.weights_hash() == hf.weights_hash()  # same noise, same device type
        rule = UpdateRule(**ES)
        log = [rule.make([(1, 1.0, 0), (2, 0.0, 0)], 0)]
        assert backend.sync(log) == 1 == hf.sync(log)
        assert backend.weights_hash() == hf.weights_hash()
        reqs = [
            GenerationRequest([{"role": "user", "content": "list files"}], seed=s)
            for s in (1, 1, 2)
        ]
        out = backend.generate(reqs)
        assert out[0].text == out[1].text  # one sampling seed, one stream
        assert all(g.tokens_in > 0 and g.finish in ("stop", "eos", "length") for g in out)
    finally:
        backend.close()
        hf.close()
