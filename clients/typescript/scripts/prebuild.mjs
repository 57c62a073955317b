// Runs before `tsc` (npm's prebuild hook): starts from an empty dist/ so nothing stale is
// left from deleted sources, and copies the repository's proto/ into the package so the
// built package carries the exact .proto files it was built against.
import { cpSync, existsSync, rmSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const source = join(pkg, "..", "..", "proto");
if (!existsSync(join(source, "tollgate", "v1", "supervisor.proto"))) {
  console.error(`prebuild: ${source} has no tollgate/v1/*.proto; build inside the Tollgate repository`);
  process.exit(1);
}
rmSync(join(pkg, "dist"), { recursive: true, force: true });
rmSync(join(pkg, "proto"), { recursive: true, force: true });
cpSync(source, join(pkg, "proto"), {
  recursive: true,
  filter: (path) => statSync(path).isDirectory() || path.endsWith(".proto"),
});
