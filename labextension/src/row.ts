// One module's row in the sidebar's tree: its name (a click inserts its path), its canonical name, a "sites"
// button, its type, parameters and the shapes the last traced cell saw. Every string is set as text.
import { count, el } from './dom';
import { canonicalName, clickTitle, ICanonicalNode, modelMarks } from './canonical';
import { editsNote, IEdit, skippedNote } from './edits';

export interface IModuleNode extends ICanonicalNode {
  name: string;
  path: string;
  type: string;
  params: number;
  total: number;
  output: number[] | null;
  grad: number[] | null;
  children: IModuleNode[];
  truncated?: boolean;
  lazy?: boolean;
  error?: string;
  edits?: IEdit[];
  skipped?: string[];
}

export interface IRowActions {
  insert(text: string): void;
  toggleSites(path: string, row: HTMLElement): void;
}

export function moduleRow(node: IModuleNode, actions: IRowActions): HTMLElement {
  const row = el('div', 'nbgrad-node-row');
  row.dataset.path = node.path;
  const button = el('button', 'nbgrad-node', node.name) as HTMLButtonElement;
  button.type = 'button';
  button.title = `${node.name}\n${clickTitle(node)}`; // whole, where a long name ends in an ellipsis
  button.dataset.path = node.path;
  button.addEventListener('click', () => actions.insert(`${node.path}.output`));
  row.appendChild(button);
  const canonical = canonicalName(node, actions.insert);
  if (canonical) {
    row.appendChild(canonical);
  }
  modelMarks(node).forEach(mark => row.appendChild(mark));
  const sites = el('button', 'nbgrad-sites-button', 'sites') as HTMLButtonElement;
  sites.title = `list the sites inside ${node.type}.forward (M.source); again to hide them`;
  sites.addEventListener('click', event => {
    event.preventDefault(); // inside a <summary>: do not fold the branch
    actions.toggleSites(node.path, row);
  });
  row.appendChild(sites);
  const type = el('span', 'nbgrad-type', node.type);
  type.title = node.type;
  row.appendChild(type);
  row.appendChild(el('span', 'nbgrad-params', `${count(node.total)} params`));
  describe(node, row);
  return row;
}

// What the row says of the module beyond its name: laziness, the last traced shapes, an error, its edits.
function describe(node: IModuleNode, row: HTMLElement): void {
  if (node.lazy) {
    row.appendChild(el('span', 'nbgrad-params', 'lazy: shapes after its first call'));
  }
  if (node.output || node.grad) {
    row.classList.add('nbgrad-touched');
    row.title = 'the last traced cell touched this module';
  }
  if (node.output) {
    row.appendChild(el('span', 'nbgrad-shape', `out [${node.output.join(', ')}]`));
  }
  if (node.grad) {
    row.appendChild(el('span', 'nbgrad-shape nbgrad-grad', `grad [${node.grad.join(', ')}]`));
  }
  if (node.error) {
    row.appendChild(el('span', 'nbgrad-note', `cannot list: ${String(node.error)}`));
  }
  for (const note of [editsNote(node.edits), skippedNote(node.skipped)]) {
    if (note) {
      row.appendChild(note);
    }
  }
}
