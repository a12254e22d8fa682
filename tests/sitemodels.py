"""Models for the `M.source` tests: GPT-2 and Llama built from configs with eager attention, and a plain
nn.Module, each with the attention (or body) module the tests open."""
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.relu(h)
        return self.fc2(h)


class PlainModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Plain()

    def forward(self, x):
        return self.body(x)


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    config._attn_implementation = "eager"
    return GPT2LMHeadModel(config).eval()


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=97, max_position_embeddings=32, bos_token_id=0,
                         eos_token_id=0, pad_token_id=0)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


def plain():
    torch.manual_seed(0)
    return PlainModel().eval()


# family -> (build, path of the module whose forward the tests open, a call site in it, the submodule it calls,
#            the input)
FAMILIES = {
    "gpt2": (gpt2, "transformer.h.0.attn", "self_c_attn_1", "c_attn", torch.tensor([[3, 14, 15, 92, 65, 35]])),
    "llama": (llama, "model.layers.0.self_attn", "self_q_proj_0", "q_proj", torch.tensor([[3, 14, 15, 92, 65, 35]])),
    "plain": (plain, "body", "self_fc2_0", "fc2", torch.randn(2, 4, generator=torch.Generator().manual_seed(1))),
}

ATTENTION = {"gpt2": "transformer.h[0].attn", "llama": "model.layers[0].self_attn"}


def expression(path: str) -> str:
    """`transformer.h.0.attn` -> `model.transformer.h[0].attn`."""
    text = "model"
    for part in path.split("."):
        text += f"[{part}]" if part.isdigit() else f".{part}"
    return text
