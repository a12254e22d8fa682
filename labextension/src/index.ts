import { JupyterFrontEndPlugin } from '@jupyterlab/application';

import { highlightPlugin } from './highlight';
import { sidebarPlugin } from './sidebar';

const plugins: JupyterFrontEndPlugin<any>[] = [sidebarPlugin, highlightPlugin];

export default plugins;
