// A safe MIME renderer for nbgrad's panel data: saved notebooks show their panels with no kernel.
// Ranked ahead of the widget view: the same payload, drawn by the same code, with or without a kernel.
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { renderPanel } from '../../nbgrad/views/panel.js';

export const MIME_TYPE = 'application/vnd.nbgrad.panel+json';

export class PanelRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('nbgrad-rendered-panel');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const payload = model.data[this._mimeType];
    if (!payload || typeof payload !== 'object' || !Array.isArray((payload as any).items)) {
      this.node.textContent = 'nbgrad: this output holds no panel data';
      return;
    }
    renderPanel(this.node, payload);
  }

  private _mimeType: string;
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  createRenderer: options => new PanelRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'nbgrad:panel-renderer',
  rendererFactory,
  rank: -20,
  dataType: 'json'
};

export default extension;
