// Loads the Tollgate proto files at run time (no generated code) with @grpc/proto-loader.

import { existsSync } from "node:fs";
import * as path from "node:path";
import * as protoLoader from "@grpc/proto-loader";

/** The proto files the client needs, relative to the proto root. */
const PROTO_FILES = ["tollgate/v1/authority.proto", "tollgate/v1/supervisor.proto"];

/**
 * How messages are decoded: camelCase fields, 64-bit integers as numbers, enums as their names,
 * bytes as Buffers, every non-oneof field present (with its default when unset), and proto3
 * `optional` fields absent when unset.
 */
const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: Number,
  enums: String,
  defaults: true,
  arrays: true,
  objects: true,
  oneofs: true,
};

/**
 * The proto root the package was built with: `npm run build` copies the repository's `proto/`
 * into the package (`<package>/proto`); this module lives in `<package>/dist/src`.
 */
export function defaultProtoRoot(): string {
  return path.resolve(__dirname, "..", "..", "proto");
}

const loaded = new Map<string, protoLoader.PackageDefinition>();

function definitions(protoRoot: string): protoLoader.PackageDefinition {
  let definition = loaded.get(protoRoot);
  if (definition === undefined) {
    if (!existsSync(path.join(protoRoot, PROTO_FILES[0]))) {
      throw new Error(
        `${protoRoot} has no ${PROTO_FILES[0]}: build the package (npm run build copies the repository's proto/) or pass protoRoot`,
      );
    }
    definition = protoLoader.loadSync(PROTO_FILES, { ...LOADER_OPTIONS, includeDirs: [protoRoot] });
    loaded.set(protoRoot, definition);
  }
  return definition;
}

/** One RPC of a service: its path and (de)serialisers. `Res` is the decoded response shape. */
export type Method<Req, Res> = protoLoader.MethodDefinition<Req, unknown, unknown, Res>;

/** The methods of `tollgate.v1.<service>`, by proto name (e.g. "MintReceipt"). */
export function serviceMethods(protoRoot: string, service: "Authority" | "Supervisor"): Record<string, Method<unknown, unknown>> {
  const definition = definitions(protoRoot)[`tollgate.v1.${service}`];
  if (definition === undefined || !("MintReceipt" in definition || "StartRun" in definition)) {
    throw new Error(`the proto files under ${protoRoot} define no service tollgate.v1.${service}`);
  }
  return definition as unknown as Record<string, Method<unknown, unknown>>;
}
