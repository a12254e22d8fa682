import { el } from './dom';

// A persistent edit of a model (%%edit MODEL), as the kernel's comm reports it on the model's own entry.
export interface IEdit {
  source: string;
  label: string;
}

// "2 edits on" beside a model, each edit's cell line and body in its tooltip; null when there are none.
export function editsNote(edits: IEdit[] | undefined): HTMLElement | null {
  if (!Array.isArray(edits) || !edits.length) {
    return null;
  }
  const note = el('span', 'nbgrad-note nbgrad-edits', `${edits.length} edit${edits.length > 1 ? 's' : ''} on`);
  note.title = edits.map(edit => `${String(edit.label)}: ${String(edit.source)}`).join('\n');
  return note;
}

// "skipped" beside a module that an active edit skips (`M.skip(v)` in its body), naming the edits in its tooltip;
// null when none does.
export function skippedNote(labels: string[] | undefined): HTMLElement | null {
  if (!Array.isArray(labels) || !labels.length) {
    return null;
  }
  const note = el('span', 'nbgrad-note nbgrad-edits nbgrad-skipped', 'skipped');
  note.title = `skipped at every call (M.skip) by ${labels.map(String).join(', ')}: nothing inside it runs`;
  return note;
}
