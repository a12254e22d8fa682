// `%%trace` / `%%backward` / `%%generate` cells: the magic line reads as a magic (name, argument,
// options), the body stays Python, and the line after the magic is not indented as if it continued an
// expression.
import { indentService } from '@codemirror/language';
import { RangeSetBuilder } from '@codemirror/state';
import {
  Decoration,
  DecorationSet,
  EditorView,
  ViewPlugin,
  ViewUpdate
} from '@codemirror/view';
import {
  EditorExtensionRegistry,
  IEditorExtensionRegistry
} from '@jupyterlab/codemirror';
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';

const MAGIC = /^(%%(?:trace|backward|generate))\b(\s*)(.*)$/;
const OPTION = /(^|\s)(--?[A-Za-z][\w-]*)/g;

const nameMark = Decoration.mark({ class: 'nbgrad-magic-name' });
const argMark = Decoration.mark({ class: 'nbgrad-magic-arg' });
const optionMark = Decoration.mark({ class: 'nbgrad-magic-option' });
const magicLine = Decoration.line({ class: 'nbgrad-magic-line' });

// The argument: MODEL of `%%trace` is one word; LOSS of `%%backward` is an expression that may hold
// spaces, so it runs up to the first option.
function argumentLength(magic: string, rest: string): number {
  if (magic === '%%trace') {
    return /^\S*/.exec(rest)![0].length;
  }
  OPTION.lastIndex = 0;
  const option = OPTION.exec(rest);
  return rest.slice(0, option ? option.index : rest.length).trimEnd().length;
}

export function magicLineDecorations(text: string, from: number): Array<[number, number, Decoration]> {
  const match = MAGIC.exec(text);
  if (!match) {
    return [];
  }
  const marks: Array<[number, number, Decoration]> = [[from, from, magicLine]];
  marks.push([from, from + match[1].length, nameMark]);
  const argStart = from + match[1].length + match[2].length;
  const argLength = argumentLength(match[1], match[3]);
  if (argLength && !match[3].startsWith('-')) {
    marks.push([argStart, argStart + argLength, argMark]);
  }
  const rest = match[3].slice(argLength);
  const restStart = argStart + argLength;
  OPTION.lastIndex = 0;
  let option: RegExpExecArray | null;
  while ((option = OPTION.exec(rest)) !== null) {
    const start = restStart + option.index + option[1].length;
    marks.push([start, start + option[2].length, optionMark]);
  }
  return marks;
}

function decorate(view: EditorView): DecorationSet {
  const builder = new RangeSetBuilder<Decoration>();
  const first = view.state.doc.line(1);
  for (const [from, to, mark] of magicLineDecorations(first.text, first.from)) {
    builder.add(from, to, mark);
  }
  return builder.finish();
}

const magicPlugin = ViewPlugin.fromClass(
  class {
    decorations: DecorationSet;
    constructor(view: EditorView) {
      this.decorations = decorate(view);
    }
    update(update: ViewUpdate) {
      if (update.docChanged) {
        this.decorations = decorate(update.view);
      }
    }
  },
  { decorations: plugin => plugin.decorations }
);

// The magic line is not Python: the first body line starts at column 0.
const magicIndent = indentService.of((context, pos) => {
  const line = context.state.doc.lineAt(pos);
  if (line.number === 2 && MAGIC.test(context.state.doc.line(1).text)) {
    return 0;
  }
  return null;
});

export const highlightPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbgrad:magic-highlight',
  description: 'Highlights %%trace / %%backward / %%generate magic lines; bodies stay Python.',
  autoStart: true,
  requires: [IEditorExtensionRegistry],
  activate: (app: JupyterFrontEnd, registry: IEditorExtensionRegistry) => {
    registry.addExtension({
      name: 'nbgrad:magic-highlight',
      factory: () =>
        EditorExtensionRegistry.createImmutableExtension([magicPlugin, magicIndent])
    });
  }
};
