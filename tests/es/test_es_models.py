"""The tiny causal LM builder: saved and loaded through the Auto classes, seeded."""

from __future__ import annotations

import torch

from runner.models import build_tiny_model, load_tiny_model


def test_tiny_model_loads_through_auto_classes_and_is_seeded(tiny_model_dir, tmp_path):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    model, tok = load_tiny_model(tiny_model_dir)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tok)
    n_params = sum(p.numel() for p in model.parameters())
    assert 10_000 < n_params < 1_000_000

    same, _ = load_tiny_model(build_tiny_model(tmp_path / "same", seed=0))
    other, _ = load_tiny_model(build_tiny_model(tmp_path / "other", seed=1))
    state, same_state, other_state = model.state_dict(), same.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], same_state[k]) for k in state)
    assert not torch.equal(
        state["model.embed_tokens.weight"], other_state["model.embed_tokens.weight"]
    )


def test_tokenizer_roundtrip_chat_template_and_generation(tiny_model_dir):
    model, tok = load_tiny_model(tiny_model_dir)
    text = "<command>grep -rn 'x' /tmp/ü.txt</command>"  # unseen bytes still tokenize
    assert tok.decode(tok(text)["input_ids"]) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "list files"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nlist files<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([tok(prompt)["input_ids"]])
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5 or out[0, -1].item() == tok.eos_token_id


def test_bf16_load(tiny_model_dir):
    model, _ = load_tiny_model(tiny_model_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
