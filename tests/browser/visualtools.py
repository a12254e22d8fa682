"""The visual check's notebook: one cell per panel kind, and the measurements the check makes on a rendered page
(in JupyterLab and in an offline HTML export alike)."""
PROMPT = "The Eiffel Tower is in the city of"
SETUP = ("%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()\n"
         "eager = nbgrad.load_model(attn_implementation='eager')\ntokenizer = nbgrad.tokenizer_for(model)\n"
         f"tokens = [tokenizer.decode([i]) for i in tokenizer({PROMPT!r})['input_ids']]\n"
         "texts = ['The cat sat', 'A dog ran far', 'One two', 'Red sky at night']\n"
         "for module in model.modules():     # leftovers the sidebar must not list as models\n    pass\n"
         "attn_module = model.transformer.h[0].attn")
ATTENTION = (f'%%trace eager "{PROMPT}" -q\n'
             "attn = eager.transformer.h[0].attn.source.attention_interface_1\n"
             "pattern = attn.source.nn_functional_softmax_0.output.save()\n"
             "with eager.output.logits[0, -1].max().backward():\n"
             "    grad = pattern.grad.save()\n"
             "attribution = (pattern * grad).save()")
# (panel kind, cell): a kind of None is a cell with no panel of its own
CELLS = [
    (None, SETUP),
    ("tensor", "%show torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0))"),
    ("logits", f'%%trace model "{PROMPT}"\nlogits = model.output.logits.save()'),
    ("gradient", f'%%trace model "{PROMPT}"\n'
                 "with model.output.logits[0, -1].max().backward():\n"
                 "    g = model.transformer.h[1].output.grad.save()\n"
                 "h = model.transformer.h[1].output.save()"),
    ("cache", f'%%trace model "{PROMPT}"\nc = cache()'),
    ("cache-grads", f'%%trace model "{PROMPT}"\ncg = cache(grads=True)\nmodel.output.logits[0, -1].max().backward()'),
    (None, ATTENTION),
    ("attention", "nbgrad.attention_pattern(pattern, tokens, title='layer 0 attention pattern')"),
    ("attention-attribution", "nbgrad.attention_pattern(attribution, tokens, title='layer 0 attention attribution')"),
    ("attribution", f'%attribute model "{PROMPT}" --target " Paris" --method saliency'),
    ("dataset", "%%trace model --over texts --batch-size 2\n"
                "grad = model.transformer.h[2].output.grad[:, -1].save()\n"
                "act = model.transformer.h[2].output[:, -1].save()\n"
                "model.lm_head.output[:, -1].max().backward()"),
    ("graph", f'%%trace model "{PROMPT}" --graph\n'
              "hidden = model.transformer.h[1].output\n"
              "scaled = hidden * 0.5 + hidden.mean(dim=-1, keepdim=True) * 0.25 + hidden.std(dim=-1, keepdim=True) * 0.1\n"
              "kept = hidden.grad.save()\n"
              "model.output.logits[0, -1].max().backward()"),
    ("invokes", "%%trace model\n"
                'with invoke("The cat sat on the mat"):\n    a = model.lm_head.output[:, -1].save()\n'
                'with invoke("Paris"):\n    b = model.lm_head.output[:, -1].save()'),
    ("generation", '%%generate model "The capital of France is" --max-new-tokens 4\n'
                   "h = model.transformer.h[1].output.save()"),
]
KINDS = [kind for kind, _ in CELLS if kind]

# Every text element of an output whose text is wider than its own box (cut or spilling over), as
# "tag.class: text"; and the pictures, with their drawn sizes.
OVERFLOWING = """root => [...root.querySelectorAll('*')].filter(el => {
    if (!el.childNodes.length || ![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) return false;
    const style = getComputedStyle(el);
    if (style.display === 'inline' || style.display === 'contents') return false;
    return el.scrollWidth > el.clientWidth + 1 && style.overflowX !== 'auto' && style.overflowX !== 'scroll';
}).map(el => `${el.tagName.toLowerCase()}.${el.className}: ${el.textContent.slice(0, 60)}`)"""
PICTURES = """root => [...root.querySelectorAll('img, canvas')].map(el => ({
    alt: el.getAttribute('alt') || el.className || el.tagName, width: el.naturalWidth || el.width,
    height: el.naturalHeight || el.height, shown: el.getBoundingClientRect().height}))"""
