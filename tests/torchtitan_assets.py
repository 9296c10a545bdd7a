"""Offline assets for running upstream TorchTitan's llama3 debug model.

TorchTitan's ``llama3_debugmodel`` reads two things relative to the working
directory, both kept in TorchTitan's git repository and not in its wheel:

* ``./tests/assets/tokenizer/`` (``hf_assets_path``): ``tokenizer.json`` plus
  ``tokenizer_config.json`` naming the BOS/EOS tokens; the model's vocabulary
  is 2048, so the tokenizer may have at most 2048 ids;
* ``./tests/assets/c4_test/`` (the ``c4_test`` dataset): a folder that
  ``datasets.load_dataset(path, split="train")`` reads, JSON lines with a
  ``text`` field.

``build(root, seq_len)`` makes both under ``root`` from the Shakespeare text
in ``examples/data/``: a byte-level BPE with 2048 ids trained with the
``tokenizers`` package, and documents cut from the plays.

Every document is exactly ``seq_len - 1`` tokens, so with TorchTitan's BOS and
EOS it is exactly one training sample (TorchTitan packs documents into
``seq_len`` windows; here no window spans two documents). That makes the
samples each rank trains on known in advance. TorchTitan gives data-parallel
rank r of n the r-th contiguous n-th of a map-style dataset, so ``c4_test``
is the 2-rank layout (the first half for rank 0, the second for rank 1) and
``c4_test_1rank`` holds the same documents in the order one rank with twice
the batch reads them: step k of a 1-rank run with batch 2b trains on exactly
the 2b samples that step k of a 2-rank run with batch b trains on.
"""
import json
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
CORPUS = REPO / "examples" / "data" / "shakespeare.txt"

VOCAB_SIZE = 2048
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
FILLER = " a"  # one token: pads a document to its exact length


def build_tokenizer(text, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    assert len(tok.encode(FILLER).ids) == 1
    tok.save(str(out_dir / "tokenizer.json"))

    def added(token):
        return {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }

    config = {
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): added(t) for t in (BOS, EOS, PAD)
        },
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "clean_up_tokenization_spaces": True,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok


def documents(tok, text, n_tokens, count):
    """count documents of consecutive words of the text, each exactly
    n_tokens tokens (padded with FILLER)."""
    words = text.split()
    docs, cur, i = [], [], 0
    while len(docs) < count:
        w = words[i % len(words)]
        i += 1
        if len(tok.encode(" ".join(cur + [w])).ids) <= n_tokens:
            cur.append(w)
            continue
        doc = " ".join(cur)
        while len(tok.encode(doc).ids) < n_tokens:
            doc += FILLER
        if len(tok.encode(doc).ids) == n_tokens:
            docs.append(doc)
        cur = [w]
    return docs


def write_dataset(docs, out_dir):
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "data.json", "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")


def build(root, seq_len=128, batch_per_rank=2, steps=32):
    """Write tests/assets/{tokenizer,c4_test,c4_test_1rank} under root.

    c4_test: 2 * batch_per_rank * steps documents, the 2-rank layout;
    c4_test_1rank: the same documents in the order a single rank with batch
    2 * batch_per_rank reads them (see the module docstring)."""
    root = pathlib.Path(root)
    assets = root / "tests" / "assets"
    text = CORPUS.read_text()
    tok = build_tokenizer(text, assets / "tokenizer")
    docs = documents(tok, text, seq_len - 1, 2 * batch_per_rank * steps)
    half = len(docs) // 2
    rank0, rank1 = docs[:half], docs[half:]
    write_dataset(rank0 + rank1, assets / "c4_test")
    one_rank = []
    for k in range(steps):
        b = slice(k * batch_per_rank, (k + 1) * batch_per_rank)
        one_rank += rank0[b] + rank1[b]
    write_dataset(one_rank, assets / "c4_test_1rank")
    return root


if __name__ == "__main__":
    import sys

    print(build(sys.argv[1] if len(sys.argv) > 1 else os.getcwd()))
