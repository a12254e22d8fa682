// Canonical names in the sidebar, for a model of a family nbgrad knows (`nbgrad.names`): each module's canonical
// name beside its own path, and the canonical values read at a module (a block's residual stream, its attention's
// q, k, v, pattern...), each a button that inserts its canonical path at the cursor. And the marks of a model's
// own row: its family, and "remote" (with where it lives) for a model held by `nbgrad.remote`.
import { el } from './dom';

export interface ICanonicalNode {
  path: string;
  canonical?: string; // `model.layers[3].attn` for `model.transformer.h[3].attn`
  values?: string[]; // `resid_pre`, ..., read at `canonical` (or at `path` for the model itself: `logits`)
  family?: string; // on a model: its family, when nbgrad knows it
  remote?: boolean; // on a model: held by a Ray actor; its tree is the notebook's skeleton
  where?: string | null; // on a remote model: its actor, process and node
}

// What a click on a module's name inserts: its own path (SPEC §7); its canonical name, beside it, inserts the
// canonical path.
export function clickTitle(node: ICanonicalNode): string {
  if (!node.canonical || node.canonical === node.path) {
    return `insert ${node.path}.output`;
  }
  return `insert ${node.path}.output; its canonical name beside it inserts ${node.canonical}.output`;
}

export function canonicalName(node: ICanonicalNode, insert: (text: string) => void): HTMLElement | null {
  if (!node.canonical || node.canonical === node.path) {
    return null;
  }
  const dot = node.canonical.indexOf('.');
  const button = el('button', 'nbgrad-canonical', dot < 0 ? node.canonical : node.canonical.slice(dot + 1));
  button.setAttribute('type', 'button');
  button.dataset.canonical = node.canonical;
  button.title = `canonical name: insert ${node.canonical}.output`;
  button.addEventListener('click', event => {
    event.preventDefault(); // inside a <summary>: do not fold the branch
    insert(`${node.canonical}.output`);
  });
  return button;
}

// The canonical values read at a module, listed under its row; null when it has none.
export function valuesList(node: ICanonicalNode, insert: (text: string) => void): HTMLElement | null {
  const values = Array.isArray(node.values) ? node.values : [];
  if (!values.length) {
    return null;
  }
  const base = node.canonical ?? node.path;
  const list = el('div', 'nbgrad-values');
  list.dataset.path = node.path;
  list.appendChild(el('span', 'nbgrad-values-label', 'values'));
  for (const value of values) {
    const text = `${base}.${String(value)}`;
    const button = el('button', 'nbgrad-value', String(value)) as HTMLButtonElement;
    button.type = 'button';
    button.dataset.value = text;
    button.title = `insert ${text}`;
    button.addEventListener('click', () => insert(text));
    list.appendChild(button);
  }
  return list;
}

// The marks on a model's own row: "remote" (and where) for a model on a cluster, its family for canonical names.
export function modelMarks(node: ICanonicalNode): HTMLElement[] {
  const marks: HTMLElement[] = [];
  if (node.remote) {
    const mark = el('span', 'nbgrad-remote', 'remote');
    mark.title = 'held by a Ray actor (nbgrad.remote); this tree is its skeleton in the notebook, on meta';
    marks.push(mark);
    if (node.where) {
      marks.push(el('span', 'nbgrad-where', String(node.where)));
    }
  }
  if (node.family) {
    const family = el('span', 'nbgrad-family', `${String(node.family)} names`);
    family.title = `a ${String(node.family)} model: canonical names (layers[i].attn, resid_post...) beside its own ` +
      'paths; a click on a canonical name inserts the canonical path';
    marks.push(family);
  }
  return marks;
}
