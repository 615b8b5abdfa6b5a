#!/usr/bin/env python3
"""Capture, on the CPU, the allocation profile of every case of the library
calibration (scripts/gpu/calibrate_libraries.py) with `vramfit.profile`, so
that `vramfit bench predict --profiles DIR` can check profile-based
predictions against the GPU's measurements.

Usage:
    PYTHONPATH=python python3 scripts/capture_library_profiles.py \
        data/calibration/h200-libraries.jsonl data/profiles/libraries [--only torchvision]

The rows may also be a set's `--dry-run` listing (name, split, library,
case, spec; no measurement), to capture before the GPU runs. A model type
without a class here is built by `AutoModelForCausalLM` from its config.
"""

import argparse
import json
import os
import sys
import time

HF_CLASS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "bert": "BertForMaskedLM", "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM",
            "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
            "gpt_neox": "GPTNeoXForCausalLM", "opt": "OPTForCausalLM",
            "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
            "roberta": "RobertaForMaskedLM", "t5": "T5ForConditionalGeneration",
            "deberta-v2": "DebertaV2ForMaskedLM", "vit": "ViTForImageClassification"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measured")
    ap.add_argument("outdir")
    ap.add_argument("--only", choices=("torchvision", "transformers"))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    from vramfit import profile

    os.makedirs(args.outdir, exist_ok=True)
    for line in open(args.measured):
        row = json.loads(line)
        if row["split"] == "repeat" or (args.only and row["library"] != args.only):
            continue
        out = os.path.join(args.outdir, row["name"] + ".profile.json")
        if (os.path.exists(out) or os.path.exists(out + ".gz")) and not args.force:
            continue
        c, m = row["case"], row["spec"]["model"]
        t0 = time.time()
        try:
            p = capture_row(profile, row, c, m)
        except Exception as e:  # noqa: BLE001
            print(f"{row['name']}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        p["name"] = row["name"]
        with open(out, "w") as f:
            json.dump(p, f, separators=(",", ":"))
        print(f"{row['name']}: {len(p['events'])} events, live peak "
              f"{p['capture']['peakLiveBytes'] / 2**30:.3f} GiB, {time.time() - t0:.1f}s",
              flush=True)


def capture_row(profile, row, c, m):
    if row["library"] == "torchvision":
        return profile.capture(f"torchvision.models:{c['model']}", {"num_classes": c["classes"]},
                               c["micro"], c["precision"], c["optimizer"],
                               input_shape=(3, c["image"], c["image"]), grad_accum=c["accum"])
    cfg = m["huggingFace"]["config"]
    # another causal LM: the Auto class, which the config's model_type names
    cls = HF_CLASS.get(c["model_type"], "AutoModelForCausalLM")
    return profile.capture(f"transformers:{cls}", cfg, c["micro"],
                           c["precision"], c["optimizer"], seq_len=c["seq"],
                           grad_accum=c["accum"], checkpointing=c["ckpt"],
                           attention=c["attention"])


if __name__ == "__main__":
    sys.exit(main())
