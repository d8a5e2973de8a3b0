// ESLint for the console's page scripts and their unit tests (`make lint`). Plain browser ES
// modules, no build step; uPlot is the one global the vendored library brings.
import js from "@eslint/js";
import importX from "eslint-plugin-import-x";
import globals from "globals";

export default [
  { ignores: ["static/vendor/**", "node_modules/**", ".venv/**", "var/**"] },
  js.configs.recommended,
  {
    files: ["static/trainyard/**/*.js"],
    plugins: { "import-x": importX },
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: { ...globals.browser, uPlot: "readonly" },
    },
    rules: {
      // The ANSI parser matches control characters on purpose: that is its job.
      "no-control-regex": "off",
      eqeqeq: ["error", "always", { null: "ignore" }], // `x == null`: null or undefined
      "no-var": "error",
      "prefer-const": "error",
      "no-implicit-globals": "error",
      // Modules import one way (static/trainyard/job/log/: display below actions, wiring in
      // logview.js): a cycle fails the lint, as the Python layers' contract does.
      "import-x/no-cycle": "error",
    },
  },
  {
    // The page scripts' unit tests (tests/js, `make jstest`): the same rules, run by Node.
    files: ["tests/js/**/*.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: globals.node },
    rules: { eqeqeq: ["error", "always", { null: "ignore" }], "no-var": "error", "prefer-const": "error" },
  },
  {
    files: ["eslint.config.js"],
    languageOptions: { sourceType: "module", globals: globals.node },
  },
];
