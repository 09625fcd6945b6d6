// Parse every ```mermaid block of the given Markdown files with Mermaid's own parser.
// Usage: node check.mjs FILE.md...   Prints one JSON line per diagram; exits 1 if any fails to parse.
// Mermaid's flowchart parser sanitizes labels with DOMPurify, which needs a DOM: jsdom provides one.
import { readFileSync } from "node:fs";
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!DOCTYPE html><body></body>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false });

let failed = 0;
for (const file of process.argv.slice(2)) {
  const text = readFileSync(file, "utf8");
  const blocks = [...text.matchAll(/^```mermaid\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
  for (const [index, diagram] of blocks.entries()) {
    try {
      const { diagramType } = await mermaid.parse(diagram);
      console.log(JSON.stringify({ file, index, ok: true, type: diagramType }));
    } catch (err) {
      failed += 1;
      console.log(JSON.stringify({ file, index, ok: false, error: String(err.message ?? err) }));
    }
  }
  if (blocks.length === 0) console.log(JSON.stringify({ file, index: null, ok: true, type: "no diagrams" }));
}
process.exit(failed ? 1 : 0);
