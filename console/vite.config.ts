// The console is built into dist/ (checked in; the server compiles it into
// its binary). The protobuf messages and service descriptors are the Node
// runner's generated stubs, so the page speaks the very contract the
// runners do; one copy of the protobuf runtime serves both.
import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

export default defineConfig({
  plugins: [react()],
  base: "/",
  resolve: {
    dedupe: ["@bufbuild/protobuf", "@connectrpc/connect"],
    // The pages are written against React's API (and type-checked against
    // its types) and run on Preact's compatibility layer: the same hooks
    // and DOM, about 180 KB less script for the browser to parse before
    // the first page shows.
    alias: [
      { find: /^react$/, replacement: "preact/compat" },
      { find: /^react\/jsx-runtime$/, replacement: "preact/compat/jsx-runtime" },
      { find: /^react\/jsx-dev-runtime$/, replacement: "preact/compat/jsx-runtime" },
      { find: /^react-dom$/, replacement: "preact/compat" },
      { find: /^react-dom\/client$/, replacement: "preact/compat/client" },
    ],
  },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 1024,
  },
  server: { fs: { allow: [".."] } },
});
