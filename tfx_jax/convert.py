"""Hugging Face checkpoints in and out: LLaMA, GPT-2, GPT-NeoX, Qwen3, Gemma 2,
Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3, BERT, T5 (1.0, v1.1), BART, Marian.

  python -m tfx_jax.convert from-hf --hf-dir DIR --workdir W
  python -m tfx_jax.convert to-hf --workdir W --out DIR

``from-hf`` reads a local ``save_pretrained`` directory (config.json and
safetensors weights; never the hub) and writes an ordinary tfx_jax run into
``W``: config.json and a step-0 orbax checkpoint, which ``evaluate``,
``generate`` and fine-tuning (``--config.finetune.init_checkpoint=W``) use as
they are. The HF directory's tokenizer (a SentencePiece model or a
tokenizer.json) is copied into ``W/tokenizer`` and becomes the run's tokenizer
(``data.tokenizer=hf``). ``to-hf`` writes a directory that HF
``from_pretrained`` loads; a run whose variant HF cannot represent (sandwich
norm, ALiBi in a GPT-2, ...) exits with code 2 naming those settings.

Importing needs only ``safetensors`` (numpy); torch is not used. The weight and
config maps are declared in :mod:`tfx_jax.hf`.
"""

from __future__ import annotations

import argparse
import sys

from tfx_jax.core.flags import exit_code
from tfx_jax.run import hf_interop


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m tfx_jax.convert",
                                   description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("from-hf", help="HF save_pretrained directory -> tfx_jax run")
  p.add_argument("--hf-dir", required=True)
  p.add_argument("--workdir", required=True)
  p = sub.add_parser("to-hf", help="tfx_jax run -> HF save_pretrained directory")
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--step", type=int, default=None)
  args = parser.parse_args(argv)
  return exit_code(_convert, args)


def _convert(args) -> None:
  if args.command == "from-hf":
    hf_interop.import_run(args.hf_dir, args.workdir)
    print(f"wrote {args.workdir} (config.json, checkpoints/0)")
  else:
    arch = hf_interop.export_run(args.workdir, args.out, args.step)
    print(f"wrote {args.out} ({arch.name})")


if __name__ == "__main__":
  sys.exit(main())
