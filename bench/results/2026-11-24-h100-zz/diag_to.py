"""Which parameters or buffers of a MiniLM-shaped BERT are off cuda:0 when weightlift.transformers.from_pretrained
is about to move the model (its last step), and whether the move then happens."""
import json, sys, tempfile
import torch
from transformers import BertConfig, BertModel
import weightlift.transformers as wt

cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, vocab_size=30522)
d = tempfile.mkdtemp()
BertModel(cfg).save_pretrained(d)
seen = []
orig = wt._to_device


def spy(model, dev):
    target = torch.device(dev)
    named = list(model.named_parameters()) + list(model.named_buffers())
    seen.append([(n, str(t.device)) for n, t in named if t.device != target])
    return orig(model, dev)


wt._to_device = spy
for _ in range(2):
    wt.from_pretrained(BertModel, d, device="cuda:0")
print(json.dumps({"off_device_before_move": seen}))
