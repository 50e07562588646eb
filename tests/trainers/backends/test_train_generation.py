"""The HF backend's decoder: rows joining a running batch, the shared prefix's KV per model version, pausing."""

from __future__ import annotations

import threading
import time

import torch
from agentlightning.trainers.backends.hf.generation import GenerationEngine, SamplingParams, training_mode_matters
from agentlightning.trainers.models import tiny_model

SYSTEM = "You are a helpful assistant. Use the calculator tool to compute 12 * 5 - 8 / 2. " * 2


def _prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in questions
    ]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def _engine(model, tokenizer, **options) -> GenerationEngine:
    engine = GenerationEngine(model, tokenizer, max_batch_size=8, batch_wait_s=0.0, **options)
    engine.eos_token_ids = set()  # every row decodes its whole budget: rows overlap for long enough
    engine.start()
    return engine


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.0005)


def _recomputed(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def test_rows_join_a_running_batch_and_keep_exact_token_ids_and_logprobs():
    model, tokenizer = tiny_model(seed=8)
    first, *later = _prompts(tokenizer, ["What is 3 + 4?", "Tom has 5 apples", "hi"])
    engine = _engine(model, tokenizer)
    try:
        long_row = engine.submit(first, SamplingParams(max_tokens=300, temperature=0.7, seed=1))
        _wait_for(lambda: engine.batches_run == 1)
        # One seeded row, one drawn with the other unseeded rows of the batch.
        joined = [
            engine.submit(p, SamplingParams(max_tokens=12, temperature=0.7, seed=2 if i else None))
            for i, p in enumerate(later)
        ]
        greedy_joined = engine.submit(later[0], SamplingParams(max_tokens=12, temperature=0))
        samples = [future.result(timeout=60) for future in joined + [greedy_joined]]
        assert not long_row.done()  # the short rows were answered while the long one kept decoding
        long_sample = long_row.result(timeout=60)
        assert engine.rows_joined >= 3 and engine.batches_run >= 2
        alone = engine.submit(later[0], SamplingParams(max_tokens=12, temperature=0)).result(timeout=60)
    finally:
        engine.stop()
    assert len(long_sample.token_ids) == 300 and all(len(s.token_ids) == 12 for s in samples)
    # What was recorded is what the model gives those tokens, however the batch was made up.
    for prompt, sample in zip([first, *later], [long_sample, *samples[:2]], strict=True):
        assert torch.allclose(
            _recomputed(model, prompt, sample.token_ids, 0.7), torch.tensor(sample.logprobs), atol=1e-4
        )
    assert samples[2].token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(samples[2].logprobs), torch.tensor(alone.logprobs), atol=1e-4)


def test_shared_prefix_kv_is_reused_across_batches_and_recomputed_for_new_weights():
    model, tokenizer = tiny_model(seed=9)
    prompts = _prompts(tokenizer, ["What is 3 + 4?", "Tom has 5 apples", "hi", "How many pens?"])
    greedy = SamplingParams(max_tokens=6, temperature=0)
    results = {}
    for sharing in (True, False):
        engine = _engine(model, tokenizer, prefix_sharing=sharing)
        engine.model_version = "v0"
        try:
            first = [f.result(timeout=60) for f in [engine.submit(p, greedy) for p in prompts[:2]]]
            alone = engine.submit(prompts[2], greedy).result(timeout=60)  # one row: the remembered prefix
            with engine.paused():
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.mul_(1.5)
                engine.model_version = "v1"
            after = engine.submit(prompts[3], greedy).result(timeout=60)
            with engine.paused(), torch.no_grad():
                for parameter in model.parameters():
                    parameter.div_(1.5)
        finally:
            engine.stop()
        results[sharing] = first + [alone, after]
        assert after.model_version == "v1" and alone.model_version == "v0"
    for shared, plain in zip(results[True], results[False], strict=True):
        assert shared.token_ids == plain.token_ids
        assert torch.allclose(torch.tensor(shared.logprobs), torch.tensor(plain.logprobs), atol=1e-4)


def test_paused_lets_running_rows_finish_on_their_weights_and_holds_new_ones():
    model, tokenizer = tiny_model(seed=10)
    prompt, other = _prompts(tokenizer, ["What is 3 + 4?", "hi"])
    engine = _engine(model, tokenizer)
    engine.model_version = "v1"
    try:
        running = engine.submit(prompt, SamplingParams(max_tokens=200, temperature=0.7, seed=3))
        _wait_for(lambda: engine.batches_run == 1)
        entered = threading.Event()

        def update() -> None:
            with engine.paused():
                entered.set()
                assert running.done()  # the running row finished before the weights could change
                waiting = engine.submit(other, SamplingParams(max_tokens=4, temperature=0))
                time.sleep(0.2)
                assert not waiting.done()  # nothing is decoded while paused
                engine.model_version = "v2"
            results.append(waiting.result(timeout=60))

        results: list = []
        updater = threading.Thread(target=update)
        updater.start()
        updater.join(timeout=60)
        assert entered.is_set() and results
    finally:
        engine.stop()
    assert running.result().model_version == "v1" and len(running.result().token_ids) == 200
    assert results[0].model_version == "v2"


def test_a_batch_decodes_in_eval_mode_and_hands_the_model_back_in_its_mode():
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_model(seed=8)
    (prompt,) = _prompts(tokenizer, ["What is 3 + 4?"])
    lora = get_peft_model(model, LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    seen: list[bool] = []  # the mode each forward of the decoder ran in
    lora.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    lora.train()  # as the trainer leaves it between updates
    engine = _engine(lora, tokenizer)
    try:
        engine.submit(prompt, SamplingParams(max_tokens=4, temperature=0.0)).result(60)
    finally:
        engine.stop()
    assert len(seen) == 4 and not any(seen)  # prefill and 3 decode steps, without the adapter's dropout...
    assert lora.training  # ...and handed back in training mode


def test_a_model_without_dropout_decodes_in_the_mode_it_is_in_so_an_update_beside_it_keeps_training_mode():
    """With ``max_staleness > 0`` the trainer's forward passes run while the decoder works on the same model: TRL
    reads ``model.training`` in its loss (the micro-batch normaliser, the metrics' split), so the decoder must not
    switch the mode of a model that computes the same in either (no dropout, as TRL leaves it)."""
    model, tokenizer = tiny_model(seed=8)
    (prompt,) = _prompts(tokenizer, ["What is 3 + 4?"])
    assert not training_mode_matters(model)
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    model.train()  # a trainer's update running
    engine = _engine(model, tokenizer)
    try:
        sample = engine.submit(prompt, SamplingParams(max_tokens=4, temperature=0.0)).result(60)
    finally:
        engine.stop()
    assert len(seen) == 4 and all(seen)  # prefill and 3 decode steps, none of them switched the model to eval
    assert len(sample.token_ids) == 4 and model.training
    model.eval()  # the same tokens and logprobs as decoding in eval mode
    again = _engine(model, tokenizer)
    try:
        assert (
            again.submit(prompt, SamplingParams(max_tokens=4, temperature=0.0)).result(60).token_ids == sample.token_ids
        )
    finally:
        again.stop()


def test_dropout_gradient_checkpointing_or_mixed_adapters_make_the_decoder_switch_to_eval_mode():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tokenizer = tiny_model(seed=8)
    assert not GenerationEngine(model, tokenizer).decodes_in_eval
    config = LlamaConfig(**{**model.config.to_dict(), "attention_dropout": 0.1})
    assert training_mode_matters(LlamaForCausalLM(config))  # the attention's own rate
    lora = get_peft_model(tiny_model(seed=8)[0], LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj"]))
    assert GenerationEngine(lora, tokenizer).decodes_in_eval  # the adapter's dropout
    model.gradient_checkpointing_enable()  # turns the KV cache off in training mode
    assert GenerationEngine(model, tokenizer).decodes_in_eval
    lora = get_peft_model(tiny_model(seed=8)[0], LoraConfig(r=4, target_modules=["q_proj"]))
    engine = GenerationEngine(lora, tokenizer)
    engine.multi_adapter = True  # PEFT refuses adapter_names= in training mode
    assert not training_mode_matters(lora) and engine.decodes_in_eval
