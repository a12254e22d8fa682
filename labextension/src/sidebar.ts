// The "nbgrad" sidebar: the module tree of every model in the active notebook's kernel, refreshed after
// each executed cell. Clicking a module inserts its path at the cursor. Talks to the kernel only
// through the `nbgrad` comm that `%load_ext nbgrad` opens; renders every string as text.
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin,
  ILabShell
} from '@jupyterlab/application';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { CommsOverSubshells, Kernel } from '@jupyterlab/services';
import { treeViewIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import { el } from './dom';
import { valuesList } from './canonical';
import { IModuleNode, moduleRow } from './row';
import { isSitesReply, SitesShown } from './sites';

// A tree this small is built at once; a bigger one (a 32-block model has ~500 modules) builds each
// branch the first time it is opened, so the sidebar opens at once whatever the model's size.
const EAGER_NODES = 200;

function size(node: IModuleNode): number {
  return 1 + node.children.reduce((total, child) => total + size(child), 0);
}

export class ModelExplorer extends Widget {
  constructor(private tracker: INotebookTracker) {
    super();
    this.id = 'nbgrad-sidebar';
    this.title.icon = treeViewIcon;
    this.title.caption = 'nbgrad: models in the kernel';
    this.title.label = 'nbgrad';
    this.addClass('nbgrad-sidebar');
    this.status = el('div', 'nbgrad-status', 'No notebook is open.');
    this.tree = el('div', 'nbgrad-tree');
    this.node.appendChild(el('div', 'nbgrad-sidebar-title', 'nbgrad — models'));
    this.node.appendChild(this.status);
    this.node.appendChild(this.tree);
    tracker.currentChanged.connect(() => this.follow(), this);
    NotebookActions.executed.connect((_, args) => {
      if (args.notebook === this.tracker.currentWidget?.content) {
        this.refresh();
      }
    }, this);
    this.follow();
  }

  private follow(): void {
    const panel = this.tracker.currentWidget;
    this.closeComm();
    if (!panel) {
      this.say('No notebook is open.');
      return;
    }
    if (!this.followed.has(panel)) {
      this.followed.add(panel);
      panel.sessionContext.kernelChanged.connect(() => {
        if (this.tracker.currentWidget === panel) {
          this.refresh();
        }
      }, this);
    }
    panel.sessionContext.ready.then(() => this.refresh()).catch(() => this.say('No kernel.'));
  }

  private closeComm(): void {
    if (this.comm && !this.comm.isDisposed) {
      this.comm.dispose();
    }
    this.comm = null;
  }

  refresh(): void {
    const panel: NotebookPanel | null = this.tracker.currentWidget;
    const kernel = panel?.sessionContext.session?.kernel;
    if (!kernel) {
      this.say('No kernel: start one to see its models.');
      this.empty();
      this.unanswered(0);
      return;
    }
    if (this.comm && !this.comm.isDisposed && this.commKernel === kernel) {
      this.unanswered(this.pending + 1);
      this.comm.send({ request: 'models' });
      return;
    }
    this.open(kernel);
  }

  // No tree: nothing shown, so the next reply with models builds one.
  private empty(): void {
    this.tree.replaceChildren();
    this.shown = '';
  }

  // The tree says it is busy (aria-busy) while a request for the models is unanswered.
  private unanswered(count: number): void {
    this.pending = Math.max(0, count);
    this.tree.setAttribute('aria-busy', String(this.pending > 0));
  }

  private open(kernel: Kernel.IKernelConnection): void {
    this.closeComm();
    this.unanswered(1);         // what the closed comm was asked is not answered now
    let answered = false;
    let comm: Kernel.IComm;
    try {
      comm = kernel.createComm('nbgrad');
      // On the main shell: JupyterLab deletes a target's shared subshell when one of its comms closes (as the kernel
      // closes one opened before `%load_ext nbgrad`), and a comm opened meanwhile had its requests refused. The main
      // shell also answers between cells, never while a cell changes the models being listed.
      comm.commsOverSubshells = CommsOverSubshells.Disabled;
    } catch (error) {
      this.say('The kernel cannot open comms.');
      this.unanswered(0);
      return;
    }
    this.comm = comm;
    this.commKernel = kernel;
    comm.onMsg = msg => {
      answered = true;
      const data = msg.content.data as any;
      if (isSitesReply(data)) {
        return this.sites.show(this.tree, data);
      }
      this.answer(data);
    };
    comm.onClose = () => {
      if (!answered) {
        this.say('nbgrad is not loaded in this kernel: run %load_ext nbgrad');
        this.empty();
      }
      if (this.comm === comm) {
        this.comm = null;
        this.unanswered(0);
      }
    };
    comm.open({ request: 'models' });
  }

  // A reply with the models: shown, and counted (the tree's data-answered).
  private answer(data: any): void {
    this.showModels(data);
    this.tree.dataset.answered = String(++this.answered);
    this.unanswered(this.pending - 1);
  }

  private say(text: string): void {
    this.status.textContent = text;
  }

  private showModels(data: any): void {
    if (!data || typeof data !== 'object') {
      this.say('nbgrad: unexpected reply from the kernel');
      return;
    }
    if (data.error) {
      this.say(`nbgrad: ${String(data.error)}`);
      return;
    }
    const models: IModuleNode[] = Array.isArray(data.models) ? data.models : [];
    if (!models.length) {
      this.say('No model in the kernel: model = nbgrad.load_model()');
      this.empty();
      return;
    }
    this.say(`${models.length} model${models.length > 1 ? 's' : ''} — click a module to insert its path`);
    // The same models as shown: the tree stays as it is (what is open, scrolled or hovered), its sites are asked anew.
    const shown = JSON.stringify(models);
    if (shown === this.shown) {
      return this.sites.ask(path => this.comm?.send({ request: 'sites', path }));
    }
    this.shown = shown;
    this.keepOpened();
    this.tree.replaceChildren(
      ...models.map(model => this.branch(model, true, size(model) <= EAGER_NODES))
    );
    this.sites.keep(this.tree, path => this.comm?.send({ request: 'sites', path }));
  }

  private row(node: IModuleNode): HTMLElement {
    return moduleRow(node, {
      insert: text => this.insert(text),
      toggleSites: (path, row) => this.sites.toggle(path, row, () => this.comm?.send({ request: 'sites', path }))
    });
  }

  // A module without children: its row, and the canonical values read there if it has any.
  private leaf(node: IModuleNode): HTMLElement {
    const leaf = el('div', 'nbgrad-leaf');
    leaf.appendChild(this.row(node));
    const values = valuesList(node, text => this.insert(text));
    if (values) {
      leaf.appendChild(values);
    }
    return leaf;
  }

  private branch(node: IModuleNode, open: boolean, eager: boolean): HTMLElement {
    if (!node.children.length) {
      return this.leaf(node);
    }
    const values = valuesList(node, text => this.insert(text));
    const details = document.createElement('details');
    details.className = 'nbgrad-branch';
    details.dataset.path = node.path;
    const summary = document.createElement('summary');
    summary.appendChild(this.row(node));
    details.appendChild(summary);
    let built = false;
    const build = () => {
      built = true;
      if (values) {
        details.appendChild(values);
      }
      for (const child of node.children) {
        details.appendChild(this.branch(child, this.opened.has(child.path), eager));
      }
      if (node.truncated) {
        details.appendChild(el('div', 'nbgrad-note', '… more modules not listed'));
      }
    };
    details.addEventListener('toggle', () => {
      if (details.open && !built) {
        build();
      }
      this.remember(node.path, details.open);
    });
    details.open = open;
    if (eager || open) {
      build();
    }
    return details;
  }

  // Branches the user opened stay open when the tree is rebuilt after a cell. The tree as it stands is read
  // before each rebuild: a 'toggle' event comes a task after the branch opened, and a reply from the
  // kernel can come between the two.
  private keepOpened(): void {
    this.tree.querySelectorAll<HTMLDetailsElement>('details.nbgrad-branch').forEach(details => {
      this.remember(details.dataset.path ?? '', details.open);
    });
  }

  private remember(path: string, open: boolean): void {
    if (open) {
      this.opened.add(path);
    } else {
      this.opened.delete(path);
    }
  }

  private insert(text: string): void {
    const cell = this.tracker.activeCell;
    const editor = cell?.editor;
    if (!editor) {
      this.say('Select a cell first, then click a module.');
      return;
    }
    if (editor.replaceSelection) {
      editor.replaceSelection(text);
    } else {
      const source = cell.model.sharedModel;
      source.setSource(source.getSource() + text);
    }
    editor.focus();
  }

  private followed = new WeakSet<NotebookPanel>();
  private opened = new Set<string>();
  private shown = '';         // the models the tree shows, as received
  private pending = 0;        // requests for the models not yet answered
  private answered = 0;       // replies with the models received (the tree's data-answered)
  private sites = new SitesShown(text => this.insert(text));
  private status: HTMLElement;
  private tree: HTMLElement;
  private comm: Kernel.IComm | null = null;
  private commKernel: Kernel.IKernelConnection | null = null;
}

export const sidebarPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbgrad:sidebar',
  description: 'Model explorer: the module tree of each model in the kernel.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker) => {
    const explorer = new ModelExplorer(tracker);
    app.shell.add(explorer, 'left', { rank: 600 });
  }
};
