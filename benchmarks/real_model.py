"""SmolLM2-135M-Instruct served by ``minikv.engine`` on the CPU, with and without the radix cache.

Two chat workloads, built with the model's own chat template:

* ``shared_system`` -- one system prompt (about 90 tokens: a support assistant's
  instructions) and 12 users' questions, each answered once, one arriving per
  engine step (so each finds the prompts prefilled before it in the tree);
* ``multi_turn`` -- 4 conversations of 3 turns: turn ``k + 1``'s prompt is the
  whole conversation so far (turn ``k``'s prompt, the answer the engine
  generated, a new message), submitted when every conversation's turn ``k`` has
  finished.

Every request generates up to 24 tokens (greedy, stopping at ``<|im_end|>``);
``--quick`` (the smoke test) asks 3 questions, 8 tokens each, 2 turns.
Variants, run in turns within each repeat so that a burst of load on the
machine falls on all alike: the naive manager (keeps nothing, the control) and
the radix cache with page sizes 1 and 16, on a pool that never runs dry, with
at most 4 requests running.

Reported per run: prompt tokens, prefill tokens computed, cached tokens, the
seconds the model spent in prefill batches and in decode batches, and the
generated tokens per second of engine time (``Engine.step``); ratios against
the naive control use the minimum of the repeats. The script **asserts** that
every variant generates exactly the naive control's tokens.

Run: ``.venv/bin/python benchmarks/real_model.py [--quick] [--repeats N]``
(one torch thread). Writes ``benchmarks/results/real_model.json``.
"""

from __future__ import annotations

import argparse

import torch
from _common import table, write_results

from minikv.engine import Engine, EngineRequest, make_engine
from minikv.models import LlamaModel, Tokenizer, load_smollm2

SYSTEM = (
    "You are the support assistant of a small cloud company. Answer in two or three short "
    "sentences, in plain words, without lists. If a question is about billing, say that the "
    "billing team answers within one working day. If a question is about an outage, point to "
    "the status page. Never promise a refund. Be friendly, and do not repeat the question."
)
QUESTIONS = [
    "How do I reset my password?", "Why is my server slow today?", "Can I get a refund?",
    "What is a virtual machine?", "How much does storage cost?", "Is there an outage right now?",
    "How do I add a teammate?", "What regions do you have?", "Can I pay by invoice?",
    "How do backups work?", "What is a load balancer?", "How do I delete my account?",
]  # fmt: skip
FOLLOW_UPS = ["Can you say more?", "Thanks. One more question: is it safe?"]
VARIANTS = {"naive": ("naive", 1), "radix ps=1": ("radix", 1), "radix ps=16": ("radix", 16)}


def chat(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, *messages], True)


def new_engine(model: LlamaModel, manager: str, page_size: int) -> Engine:
    return make_engine(model, num_pages=4096 // page_size, page_size=page_size, manager=manager, max_running=4)


def shared_system(
    tokenizer: Tokenizer, engine: Engine, questions: list[str], turns: int, max_new: int
) -> list[list[int]]:
    stop = tokenizer.encode("<|im_end|>")
    requests = []
    for question in questions:  # one arrival per step
        requests.append(
            engine.submit(EngineRequest(chat(tokenizer, [{"role": "user", "content": question}]), max_new, stop))
        )
        engine.step()
    engine.run()
    return [r.output for r in requests]


def multi_turn(tokenizer: Tokenizer, engine: Engine, questions: list[str], turns: int, max_new: int) -> list[list[int]]:
    stop = tokenizer.encode("<|im_end|>")
    conversations = [[{"role": "user", "content": q}] for q in questions[:4]]
    outputs: list[list[int]] = []
    for turn in range(turns):
        answers = engine.generate([chat(tokenizer, c) for c in conversations], max_new, stop)
        outputs += answers
        if turn == turns - 1:
            break
        for conversation, answer in zip(conversations, answers, strict=True):
            conversation.append({"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)})
            conversation.append({"role": "user", "content": FOLLOW_UPS[turn]})
    return outputs


WORKLOADS = {"shared_system": shared_system, "multi_turn": multi_turn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 questions, 1 repeat (the smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 1 if args.quick else args.repeats
    questions, turns, max_new = (QUESTIONS[:3], 2, 8) if args.quick else (QUESTIONS, 1 + len(FOLLOW_UPS), 24)
    model, tokenizer = load_smollm2(max_positions=1024)

    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    for _ in range(repeats):
        for workload, run in WORKLOADS.items():
            for variant, (manager, page_size) in VARIANTS.items():  # in turns: a burst falls on all alike
                engine = new_engine(model, manager, page_size)
                outputs[workload, variant] = run(tokenizer, engine, questions, turns, max_new)
                engine.check()
                s = engine.stats
                samples.setdefault((workload, variant), []).append({
                    "prompt_tokens": s.prompt_tokens, "prefill_tokens": s.prefill_tokens,
                    "cached_tokens": s.cached_tokens, "generated": sum(map(len, outputs[workload, variant])),
                    "prefill_s": s.prefill_seconds, "decode_s": s.model_seconds - s.prefill_seconds,
                    "engine_s": s.step_seconds,
                })  # fmt: skip

    rows = []
    for workload in WORKLOADS:
        naive = outputs[workload, "naive"]
        for variant in VARIANTS:
            assert outputs[workload, variant] == naive, f"{workload}: {variant} generated other tokens than naive"
            runs = samples[workload, variant]
            best = {key: min(r[key] for r in runs) for key in ("prefill_s", "decode_s", "engine_s")}
            control = {key: min(r[key] for r in samples[workload, "naive"]) for key in best}
            first = runs[0]
            rows.append({
                "workload": workload, "variant": variant, "requests": len(naive),
                "prompt_tokens": first["prompt_tokens"], "prefill_tokens": first["prefill_tokens"],
                "cached_share": first["cached_tokens"] / first["prompt_tokens"],
                "prefill_s": best["prefill_s"], "prefill_vs_naive": best["prefill_s"] / control["prefill_s"],
                "decode_s": best["decode_s"], "engine_s": best["engine_s"],
                "engine_vs_naive": best["engine_s"] / control["engine_s"],
                "tokens_per_s": first["generated"] / best["engine_s"],
            })  # fmt: skip
    columns = ["workload", "variant", "requests", "prompt_tokens", "prefill_tokens", "cached_share", "prefill_s",
               "prefill_vs_naive", "decode_s", "engine_s", "engine_vs_naive", "tokens_per_s"]  # fmt: skip
    formats = {"cached_share": ".0%", "prefill_s": ".2f", "prefill_vs_naive": ".2f", "decode_s": ".2f",
               "engine_s": ".2f", "engine_vs_naive": ".2f", "tokens_per_s": ".1f"}  # fmt: skip
    print(table(rows, columns, formats))
    path = write_results(
        "real_model", {"quick": args.quick, "repeats": repeats, "max_new_tokens": max_new, "rows": rows}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
