// The sites of one module's forward in the sidebar: asked for with the "sites" button of a module row,
// listed under that row; clicking a site inserts `PATH.source.NAME.output` at the cursor.
import { el } from './dom';

export interface ISitesReply {
  reply: 'sites';
  path: string;
  sites: string[];
  truncated?: boolean;
  error?: string;
}

export function isSitesReply(data: any): data is ISitesReply {
  return !!data && typeof data === 'object' && data.reply === 'sites' && typeof data.path === 'string';
}

// The list to put under the module's row (every string as text, never markup).
export function sitesList(data: ISitesReply, insert: (text: string) => void): HTMLElement {
  const list = el('div', 'nbgrad-sites');
  list.dataset.path = data.path;
  if (data.error) {
    list.appendChild(el('div', 'nbgrad-note', `no sites: ${String(data.error)}`));
    return list;
  }
  for (const name of Array.isArray(data.sites) ? data.sites : []) {
    const button = el('button', 'nbgrad-site', String(name)) as HTMLButtonElement;
    button.type = 'button';
    button.title = `insert ${data.path}.source.${name}.output`;
    button.addEventListener('click', () => insert(`${data.path}.source.${name}.output`));
    list.appendChild(button);
  }
  if (data.truncated) {
    list.appendChild(el('div', 'nbgrad-note', '… more sites not listed (%source lists them all)'));
  }
  return list;
}

// Replace the list shown under the row of `path`, if that row is in the tree.
export function showSites(tree: HTMLElement, data: ISitesReply, insert: (text: string) => void): void {
  const rows = Array.from(tree.querySelectorAll<HTMLElement>('.nbgrad-node-row'));
  const row = rows.find(r => r.dataset.path === data.path);
  if (!row) {
    return;
  }
  row.parentElement?.querySelector(`:scope > .nbgrad-sites`)?.remove();
  row.insertAdjacentElement('afterend', sitesList(data, insert));
}

// The modules whose sites the sidebar lists. They stay listed when the tree is rebuilt after a cell: the list last
// received is shown again at once, and asked for anew (the model may have changed). A request the kernel never
// answered (its comm was replaced in between) is sent again then too.
export class SitesShown {
  constructor(private insert: (text: string) => void) {}

  // The "sites" button of a row: list the module's sites, or hide them when they are listed.
  toggle(path: string, row: HTMLElement, request: () => void): void {
    const shown = row.parentElement?.querySelector(':scope > .nbgrad-sites');
    if (shown && this.replies.has(path)) {
      this.replies.delete(path);
      shown.remove();
      return;
    }
    this.replies.set(path, this.replies.get(path) ?? null);
    request();
  }

  // A reply from the kernel: shown, unless the list was hidden again before it came.
  show(tree: HTMLElement, data: ISitesReply): void {
    if (this.replies.has(data.path)) {
      this.replies.set(data.path, data);
      showSites(tree, data, this.insert);
    }
  }

  // After the tree is rebuilt.
  keep(tree: HTMLElement, request: (path: string) => void): void {
    this.replies.forEach((reply, path) => {
      if (reply) {
        showSites(tree, reply, this.insert);
      }
      request(path);
    });
  }

  // The tree was kept: ask for each list again.
  ask(request: (path: string) => void): void {
    this.replies.forEach((_, path) => request(path));
  }

  private replies = new Map<string, ISitesReply | null>(); // path -> its last reply (null: none yet)
}
