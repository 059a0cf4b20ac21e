"""Make the GuideLLM test fixture: GuideLLM's ``benchmarks.json`` of a two-rate Poisson sweep
against the ``vllm`` backend's server (tiny Qwen3, vLLM CPU, 127.0.0.1), for the importer's tests.

GuideLLM is not a dependency of the project: install it into a venv of its own (it brings its
own torch) and pass its ``guidellm`` command::

    python -m venv /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm==0.8.1
    python -m benchmarks.truth.make_guidellm_fixture --guidellm /tmp/gl-venv/bin/guidellm \
        --out tests/data/guidellm/guidellm_benchmarks_tiny.json

The saved file has every request's generated text and request arguments; they are emptied (the
random model's text says nothing) and local paths replaced by ``<scratch>`` to keep it small.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.truth.served import served_vllm

DROP_TEXT = ("output", "request_args", "reasoning_output")


def _scrub(node: Any, paths: tuple[str, ...]) -> Any:
    """The report with per-request texts emptied and local paths replaced."""
    if isinstance(node, dict):
        return {
            k: (None if k in DROP_TEXT and isinstance(v, str) else _scrub(v, paths))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_scrub(v, paths) for v in node]
    if isinstance(node, str):
        for p in paths:
            node = node.replace(p, "<scratch>")
    return node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--guidellm", required=True, help="the guidellm command (its own venv)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rates", default="2,4", help="Poisson rates, one benchmark each")
    parser.add_argument("--requests", type=int, default=16, help="requests per benchmark")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="guidellm-fixture-"))
    rates = args.rates.split(",")
    with served_vllm(root) as served:
        cmd = [
            args.guidellm,
            "run",
            "--backend",
            f"kind=openai_http,target={served.base_url},model=qwen3_tiny,"
            "request_format=/v1/completions",
            "--profile",
            f"kind=poisson,rate={rates[0]}",
            "--override",
            "profile.rate",
            ",".join(rates),
            "--constraint",
            f"kind=max_requests,count={args.requests}",
            "--tokenizer",
            f"kind=huggingface_auto,model={served.model_dir}",
            "--data",
            "kind=synthetic_text,prompt_tokens=128,output_tokens=32",
            "--output",
            f"kind=json,path={root / 'benchmarks.json'}",
            "--disable-console-interactive",
        ]
        print(" ".join(cmd))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run(cmd, check=True, timeout=900, cwd=root, env=env)
    report = json.loads((root / "benchmarks.json").read_text())
    scrubbed = _scrub(report, (str(served.model_dir.resolve()), str(root)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(scrubbed, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
