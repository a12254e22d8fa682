// The sites of one module's forward in the sidebar: asked for with the "sites" button of a module row,
// listed under that row; clicking a site inserts `PATH.source.NAME.output` at the cursor.

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
  const list = document.createElement('div');
  list.className = 'nbgrad-sites';
  list.dataset.path = data.path;
  if (data.error) {
    const note = document.createElement('div');
    note.className = 'nbgrad-note';
    note.textContent = `no sites: ${String(data.error)}`;
    list.appendChild(note);
    return list;
  }
  for (const name of Array.isArray(data.sites) ? data.sites : []) {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'nbgrad-site';
    button.textContent = String(name);
    button.title = `insert ${data.path}.source.${name}.output`;
    button.addEventListener('click', () => insert(`${data.path}.source.${name}.output`));
    list.appendChild(button);
  }
  if (data.truncated) {
    const note = document.createElement('div');
    note.className = 'nbgrad-note';
    note.textContent = '… more sites not listed (%source lists them all)';
    list.appendChild(note);
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
