// The console is built into dist/ (checked in; the server compiles it into
// its binary). The protobuf messages and service descriptors are the Node
// runner's generated stubs, so the page speaks the very contract the
// runners do; one copy of the protobuf runtime serves both.
import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

export default defineConfig({
  plugins: [react()],
  base: "/",
  resolve: { dedupe: ["@bufbuild/protobuf", "@connectrpc/connect"] },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 1024,
  },
  server: { fs: { allow: [".."] } },
});
