// Corridor, in JavaScript: walk right to the exit before the steps run out.
//
// The same game as examples/corridor (Rust) and examples/corridor-py, step
// for step. jco wants an export named after the interface, `environment`,
// with `info()` and the resource class `Env`. A u64 arrives as a BigInt; a
// `result` is returned on success and thrown on failure (the thrown error's
// `payload` is the env-error); a variant is `{ tag, val }`. The optional
// `batch` export (many envs in one call) is built with the world
// `env-plugin-batched`; drop it and use `env-plugin` to ship single calls
// only. Build: see examples/README.md.

function fail(kind, message) {
  const error = new Error(message);
  error.payload = { kind, message };
  return error;
}

class Env {
  static create(config) {
    let length = 5;
    for (const [key, value] of config) {
      if (key !== "length") throw fail("unknown-key", `unknown key \`${key}\`; this env accepts: length`);
      if (!/^[0-9]+$/.test(value) || Number(value) < 2 || Number(value) > 50) {
        throw fail("bad-value", `\`length\` must be in 2..=50, got \`${value}\``);
      }
      length = Number(value);
    }
    const env = new Env();
    Object.assign(env, { length, player: 0, steps: 0, started: false, done: false });
    return env;
  }

  spec() {
    return {
      instructions: "You are in a corridor. Reach the exit E.",
      legend: [
        { symbol: "P", meaning: "you" },
        { symbol: "_", meaning: "floor" },
        { symbol: "E", meaning: "exit" },
      ],
      actionSpace: { tag: "names", val: ["Left", "Right"] },
      limits: { maxActionsPerEpisode: 20, maxActionsPerTurn: 5, maxTurns: 5, maxSteps: 20 },
      metrics: [],
    };
  }

  reset(seed) {
    // Start somewhere left of the exit, chosen by the seed (a BigInt).
    this.player = Number(seed % BigInt(this.length - 1));
    Object.assign(this, { steps: 0, started: true, done: false });
    return this.render();
  }

  step(action) {
    // The Rust kit checks these rules for every env; here we do.
    if (!this.started) throw fail("not-started", "step before reset; call reset(seed) first");
    if (this.done) throw fail("episode-over", "the episode is over; call reset(seed)");
    // An action is a variant: `{ tag: "id", val }` for a names space.
    if (action.tag !== "id" || action.val > 1) throw fail("bad-action", `action ${JSON.stringify(action)} is not an id in 0..=1`);
    const before = this.player;
    this.player = action.val === 0 ? Math.max(this.player - 1, 0) : Math.min(this.player + 1, this.length - 1);
    this.steps += 1;
    const success = this.player === this.length - 1;
    this.done = success || this.steps >= 20;
    return {
      observation: this.render(),
      reward: success ? 1.0 : 0.0,
      done: this.done,
      info: { success, actionIsValid: true, actionIsEffective: this.player !== before, metrics: [] },
    };
  }

  render() {
    let row = "";
    for (let i = 0; i < this.length; i++) row += i === this.player ? "P" : i === this.length - 1 ? "E" : "_";
    return row;
  }
}

export const environment = {
  info() {
    return {
      name: "corridor",
      version: "0.1.0",
      description: "Walk right along a corridor to reach the exit.",
      multiTurn: true,
      configKeys: [{ name: "length", defaultValue: "5", description: "cells in the corridor (2..=50)" }],
    };
  },
  Env,
};

// One item of a batch: the call's value, or the env-error it threw.
function attempt(call) {
  try {
    return { tag: "ok", val: call() };
  } catch (e) {
    if (e.payload === undefined) throw e;
    return { tag: "err", val: e.payload };
  }
}

export const batch = {
  resetMany(envs, seeds) {
    return envs.map((env, i) => attempt(() => env.reset(seeds[i])));
  },
  stepMany(envs, actions) {
    return envs.map((env, i) => attempt(() => env.step(actions[i])));
  },
};
