// A UMD library build: Airflow's UI imports the bundle as a module and renders
// globalThis.AirflowPlugin. React, its JSX runtime, React Router and Chakra UI are the host's
// (its globals), so the plugin shares their state (hooks, router, theme) and stays small.
import { defineConfig } from "vite";

const HOST_GLOBALS = {
  react: "React",
  "react-dom": "ReactDOM",
  "react/jsx-runtime": "ReactJSXRuntime",
  "react-router-dom": "ReactRouterDOM",
  "@chakra-ui/react": "ChakraUI",
};

export default defineConfig({
  esbuild: { jsx: "automatic", jsxImportSource: "react" },
  define: { "process.env.NODE_ENV": JSON.stringify("production") },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    minify: true,
    lib: {
      entry: "src/main.jsx",
      name: "AirflowPlugin",
      formats: ["umd"],
      fileName: () => "broker-ui.umd.cjs",
    },
    rollupOptions: {
      external: Object.keys(HOST_GLOBALS),
      output: { globals: HOST_GLOBALS, exports: "default" },
    },
  },
});
