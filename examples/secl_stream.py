"""SECL on a small question stream: answers, verbalized confidences and label-free calibration.

    python examples/secl_stream.py --model HuggingFaceTB/SmolLM2-135M-Instruct \
        --stream mmlu:stem,mmlu:humanities,halueval_qa --limit-per-domain 10 --output-dir secl_adapter

``apply_secl`` wraps the model (a LoRA adapter through PEFT) and returns the SECL model; every ``generate`` call is one step of the
stream (each prompt of a batch is one question). Outside calibration bursts the only extra cost is
reading the verbalized confidence; inside a burst (opened by the entropy gate, or here also at the
start of the stream) the LoRA adapter takes a step toward P(True)Norm. For the full comparison with
the baselines use ``hf-calibration secl``.
"""


import torch

from hf_calibration.modeling import load_model
from hf_calibration.secl import SECLConfig, apply_secl
from hf_calibration.modeling.streams import build_stream, judge


def main():
    from hf_calibration.cli import script_parser

    parser = script_parser("python examples/secl_stream.py", __doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--stream", default="mmlu:stem,mmlu:humanities,halueval_qa")
    parser.add_argument("--limit-per-domain", type=int, default=10)
    parser.add_argument("--burst-size", type=int, default=10)
    parser.add_argument("--output-dir", default=None, help="save the calibrated adapter here")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    model = apply_secl(model, tokenizer, SECLConfig(burst_size=args.burst_size))
    items = build_stream(tokenizer, args.stream, limit_per_domain=args.limit_per_domain)
    model.start_burst()  # treat the start of the stream as a shift
    for item in items:
        ids = torch.tensor([item.prompt_ids])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, return_dict_in_generate=True,
            # MCQA: P(True) about "B. <option text>" for the answer and the other options (the distractors of
            # P(True)Norm); open-ended (None): beam-search alternatives
            secl_choices=[item.choices],
            pad_token_id=tokenizer.pad_token_id,
        )
        text = tokenizer.decode(out.sequences[0, len(item.prompt_ids):], skip_special_tokens=True)
        record = model.secl_records[0].to_dict()
        _, correct = judge(item, text)
        print(f"{item.domain:16s} answer={text.strip()[:12]!r:16s} correct={correct!s:5s} "
              f"confidence={float(out.confidences[0]):.2f} burst={record['in_burst']!s:5s} updated={record['updated']}")
    print("counters:", model.secl_counters)
    if args.output_dir:
        model.save_pretrained(args.output_dir)  # a PEFT adapter folder plus secl_config.json / secl_state.json
        print("saved", args.output_dir)


if __name__ == "__main__":
    main()
