"""Run llama.cpp's convert_hf_to_gguf.py on a model whose tokenizer was trained here.

The converter names a BPE pre-tokenizer by hashing how the tokenizer splits a test text, and
refuses one it has never seen ("BPE pre-tokenizer was not recognized"), which is every tokenizer
trained locally. Ours (tests/support/tiny_model.py) pre-tokenizes with the ByteLevel regex of GPT-2, so
it is told `gpt-2`. Runs in the transformers venv of tests/support/real_servers.py:

    python convert_tiny_gguf.py CONVERTER_DIR MODEL_DIR --outfile tiny.gguf --outtype f32
"""

import runpy
import sys
from pathlib import Path

converter = Path(sys.argv.pop(1))
sys.path[:0] = [str(converter), str(converter / "gguf-py")]  # its own gguf package, as it does

from conversion import base  # noqa: E402  (importable only once the converter is on the path)

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = str(converter / "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
