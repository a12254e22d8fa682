// The panel renderer is one plain ES module shared with the kernel-side widget (nbgrad/views/panel.js).
declare module '*/views/panel.js' {
  export function renderPanel(root: HTMLElement, payload: unknown): void;
}
