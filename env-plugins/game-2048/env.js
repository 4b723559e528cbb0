// 2048 on a small board: slide the tiles, merge equal ones, reach the target.
//
// A ragen-rs environment plugin written in JavaScript and packaged as a
// WebAssembly component with `jco componentize` (see the repository's
// Makefile and examples/README.md). It tests what the other games do not:
// planning under chance, since a new tile lands on a random empty cell after
// every move. The randomness comes only from the seed given to reset.
//
// jco maps the WIT to JavaScript: the exported interface `environment` is an
// object with `info()` and the resource class `Env`; u64 is a BigInt; a
// `result` is returned on success and thrown on failure; records are
// objects with camelCase fields; enums are their kebab-case names; a
// variant is `{ tag, val }` (an action is `{ tag: "id", val: 2 }`).

const VERSION = "0.2.0";

// name -> [default, description]. Every key `create` accepts.
const CONFIG_KEYS = {
  size: ["3", "cells per side of the board (2..=6)"],
  target: ["32", "the tile that wins, a power of two (8..=2048)"],
  max_moves: ["30", "moves before the episode ends unsolved (1..=500)"],
  four_percent: ["10", "chance in percent that a new tile is a 4 instead of a 2 (0..=100)"],
};

const ACTIONS = ["Up", "Down", "Left", "Right"];

const INSTRUCTIONS =
  "You are playing 2048. Tiles with numbers sit on a square board. A move " +
  "slides every tile as far as it goes in one direction; two equal tiles that " +
  "collide merge into one tile with their sum. After every move that changes " +
  "the board, a new 2 or 4 appears on a random empty cell. Make a tile with " +
  "the target value before the moves run out or the board locks up.";

class EnvFailure extends Error {
  constructor(kind, message) {
    super(message);
    // jco turns a thrown error's `payload` into the `err` of the result.
    this.payload = { kind, message };
  }
}

function parseInt(settings, name, lo, hi) {
  const raw = settings.has(name) ? settings.get(name) : CONFIG_KEYS[name][0];
  if (!/^[0-9]+$/.test(raw)) {
    throw new EnvFailure("bad-value", `\`${name}\` must be a whole number, got \`${raw}\``);
  }
  const value = Number(raw);
  if (value < lo || value > hi) {
    throw new EnvFailure("bad-value", `\`${name}\` must be in ${lo}..=${hi}, got ${value}`);
  }
  return value;
}

// A small, fast, portable generator (sfc32) seeded through splitmix64 from
// the 64-bit seed, so every engine draws the same numbers for a seed.
function seededRandom(seed) {
  let s = BigInt.asUintN(64, seed);
  const words = [];
  for (let i = 0; i < 4; i++) {
    s = BigInt.asUintN(64, s + 0x9e3779b97f4a7c15n);
    let z = s;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    z = z ^ (z >> 31n);
    words.push(Number(BigInt.asUintN(32, z)));
  }
  let [a, b, c, d] = words;
  return function next() {
    // One 32-bit draw, as an integer in 0..2^32.
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return t >>> 0;
  };
}

class Env {
  static create(config) {
    const settings = new Map(config);
    for (const name of settings.keys()) {
      if (!(name in CONFIG_KEYS)) {
        const known = Object.keys(CONFIG_KEYS).join(", ");
        throw new EnvFailure("unknown-key", `unknown key \`${name}\`; this env accepts: ${known}`);
      }
    }
    const env = new Env();
    env.size = parseInt(settings, "size", 2, 6);
    env.target = parseInt(settings, "target", 8, 2048);
    if ((env.target & (env.target - 1)) !== 0) {
      throw new EnvFailure("bad-value", `\`target\` must be a power of two, got ${env.target}`);
    }
    env.maxMoves = parseInt(settings, "max_moves", 1, 500);
    env.fourPercent = parseInt(settings, "four_percent", 0, 100);
    env.board = null; // null until the first reset
    return env;
  }

  spec() {
    const turns = Math.ceil(this.maxMoves / 3);
    return {
      instructions: INSTRUCTIONS + ` The target is ${this.target}.`,
      legend: [
        { symbol: ".", meaning: "empty cell" },
        { symbol: "2, 4, 8, ...", meaning: "a tile and its value" },
      ],
      actionSpace: { tag: "names", val: ACTIONS },
      limits: { maxActionsPerEpisode: this.maxMoves, maxActionsPerTurn: 3, maxTurns: turns, maxSteps: this.maxMoves },
      metrics: ["max_tile", "score", "empty_cells"],
    };
  }

  reset(seed) {
    this.random = seededRandom(seed);
    this.board = new Array(this.size * this.size).fill(0);
    this.moves = 0;
    this.score = 0;
    this.done = false;
    this.spawn();
    this.spawn();
    return this.render();
  }

  step(action) {
    if (this.board === null) {
      throw new EnvFailure("not-started", "step before the first reset; call reset(seed) first");
    }
    if (this.done) {
      throw new EnvFailure("episode-over", "the episode is over; call reset(seed) to start a new one");
    }
    if (action.tag !== "id" || action.val >= ACTIONS.length) {
      throw new EnvFailure("bad-action", `action ${JSON.stringify(action)} is not an id in 0..=${ACTIONS.length - 1}`);
    }
    const merged = this.slide(action.val);
    const changed = merged >= 0;
    if (changed) {
      this.score += merged;
      this.spawn();
    }
    this.moves += 1;
    const maxTile = Math.max(...this.board);
    const success = maxTile >= this.target;
    this.done = success || this.moves >= this.maxMoves || !this.canMove();
    return {
      observation: this.render(),
      // The merged value over the target (the merge that makes the target
      // earns 1), plus 1 for reaching it: dense enough to learn from.
      reward: (changed ? merged : 0) / this.target + (success ? 1 : 0),
      done: this.done,
      info: {
        success,
        actionIsValid: true,
        actionIsEffective: changed,
        metrics: [maxTile, this.score, this.board.filter((v) => v === 0).length],
      },
    };
  }

  render() {
    if (this.board === null) return "";
    const width = String(Math.max(...this.board, 2)).length;
    const rows = [];
    for (let r = 0; r < this.size; r++) {
      const cells = [];
      for (let c = 0; c < this.size; c++) {
        const v = this.board[r * this.size + c];
        cells.push((v === 0 ? "." : String(v)).padStart(width));
      }
      rows.push(cells.join(" "));
    }
    return rows.join("\n");
  }

  // Put a 2 (or a 4) on a random empty cell.
  spawn() {
    const empty = [];
    this.board.forEach((v, i) => v === 0 && empty.push(i));
    if (empty.length === 0) return;
    const cell = empty[this.random() % empty.length];
    this.board[cell] = this.random() % 100 < this.fourPercent ? 4 : 2;
  }

  // The cells of each line in the direction of travel: the first cell is
  // where tiles pile up.
  lines(action) {
    const n = this.size;
    const lines = [];
    for (let k = 0; k < n; k++) {
      const line = [];
      for (let j = 0; j < n; j++) {
        if (action === 0) line.push(j * n + k); // Up: column k, top first
        else if (action === 1) line.push((n - 1 - j) * n + k); // Down
        else if (action === 2) line.push(k * n + j); // Left: row k, left first
        else line.push(k * n + (n - 1 - j)); // Right
      }
      lines.push(line);
    }
    return lines;
  }

  // Slide and merge; the merged total, or -1 when nothing moved.
  slide(action) {
    let merged = 0;
    let changed = false;
    for (const line of this.lines(action)) {
      const tiles = line.map((i) => this.board[i]).filter((v) => v !== 0);
      const out = [];
      for (let j = 0; j < tiles.length; j++) {
        if (j + 1 < tiles.length && tiles[j] === tiles[j + 1]) {
          out.push(tiles[j] * 2);
          merged += tiles[j] * 2;
          j += 1;
        } else {
          out.push(tiles[j]);
        }
      }
      line.forEach((cell, j) => {
        const v = j < out.length ? out[j] : 0;
        if (this.board[cell] !== v) changed = true;
        this.board[cell] = v;
      });
    }
    return changed ? merged : -1;
  }

  canMove() {
    const n = this.size;
    for (let i = 0; i < n * n; i++) {
      const v = this.board[i];
      if (v === 0) return true;
      if (i % n + 1 < n && this.board[i + 1] === v) return true;
      if (i + n < n * n && this.board[i + n] === v) return true;
    }
    return false;
  }
}

export const environment = {
  info() {
    return {
      name: "2048",
      version: VERSION,
      description: "Slide and merge tiles on a small board to reach a target tile (written in JavaScript).",
      multiTurn: true,
      configKeys: Object.entries(CONFIG_KEYS).map(([name, [defaultValue, description]]) => ({ name, defaultValue, description })),
    };
  },
  Env,
};

// One item of a batch: the call's value, or the env-error it threw (any
// other exception is a bug and traps, as it would in a single call).
function attempt(call) {
  try {
    return { tag: "ok", val: call() };
  } catch (e) {
    if (e.payload === undefined) throw e;
    return { tag: "err", val: e.payload };
  }
}

// The contract's optional batched calls: many envs in one crossing.
export const batch = {
  resetMany(envs, seeds) {
    return envs.map((env, i) => attempt(() => env.reset(seeds[i])));
  },
  stepMany(envs, actions) {
    return envs.map((env, i) => attempt(() => env.step(actions[i])));
  },
};
