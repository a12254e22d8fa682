"""Build nbgrad's embedded default model from scripts/default_corpus.txt.

Deterministic: a byte-level BPE tokenizer trained on the corpus, then a GPT-2-shaped model
(4 blocks, width 128) trained briefly on it with a fixed seed, single-threaded. Writes
nbgrad/data/default/. Run from the repository root: `python scripts/make_default_model.py`.
"""
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "scripts" / "default_corpus.txt"
OUT = ROOT / "nbgrad" / "data" / "default"
VOCAB_SIZE = 1024
CONTEXT = 128
STEPS = 400


def build_tokenizer(text: str) -> GPT2TokenizerFast:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text.splitlines(), vocab_size=VOCAB_SIZE, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer,
                                  bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.model_max_length = CONTEXT
    return tokenizer


def train(model: GPT2LMHeadModel, ids: torch.Tensor) -> None:
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    window = 64
    model.train()
    for step in range(STEPS):
        starts = torch.randint(0, len(ids) - window - 1, (16,), generator=generator)
        batch = torch.stack([ids[s:s + window] for s in starts.tolist()])
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step:4d} loss {loss.item():.3f}")
    model.eval()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    text = CORPUS.read_text()
    tokenizer = build_tokenizer(text)
    ids = torch.tensor(tokenizer(text)["input_ids"])
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=CONTEXT, n_embd=128, n_layer=4,
                        n_head=4, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config)
    train(model, ids)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT)
    tokenizer.save_pretrained(OUT)
    print(f"wrote {OUT} ({sum(p.numel() for p in model.parameters())} parameters)")


if __name__ == "__main__":
    main()
