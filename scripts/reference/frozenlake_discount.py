#!/usr/bin/env python3
"""How much success within the action budget discounting gives up on FrozenLake.

The FrozenLake recipe (``examples/configs/frozenlake.toml``) trains with
gamma = 0.95, while success is counted within ten actions. The policy reads
only the current grid, so it is stationary: it cannot act on how many
actions are left. This script asks whether the best stationary policy for
a discount gamma is as good at the budgeted goal as the best policy at all.

It draws maps as the plugin's generator does (``env-plugins/frozenlake/src/
lake.rs``: each tile frozen with probability ``p``, start and goal on two
random distinct cells, redrawn until the goal is reachable; 4x4, p = 0.8 by
default), with the plugin's slippery rule (the intended move with
probability 1/3, each perpendicular one with 1/3). For each map it computes:

* the finite-horizon optimum: value iteration over ``--budget`` actions, the
  bound ``ragen-host eval`` reports as ``optimal_success``;
* for each gamma, the stationary policy greedy in the discounted values
  (reward 1 at the goal, holes and goal terminal), and that policy's success
  within the budget.

It prints the mean over ``--maps`` maps. Its own random maps, not the
plugin's seeds, so the bound differs from eval's by sampling: compare the
gaps between policies, not the bounds. What it found is in
docs/notebook.md#frozenlake-what-did-not-help.

Not part of CI. Needs numpy (``target/ref-venv/bin/python``, see
``policy_bench.py``):

    target/ref-venv/bin/python scripts/reference/frozenlake_discount.py
"""

import argparse
import random

import numpy as np

LEFT, DOWN, RIGHT, UP = range(4)


def moved(size, cell, action):
    row, col = divmod(cell, size)
    if action == LEFT and col > 0:
        return cell - 1
    if action == DOWN and row + 1 < size:
        return cell + size
    if action == RIGHT and col + 1 < size:
        return cell + 1
    if action == UP and row > 0:
        return cell - size
    return cell


def reachable(size, tiles, start):
    seen, stack = {start}, [start]
    while stack:
        cell = stack.pop()
        if tiles[cell] == "G":
            return True
        for action in range(4):
            nxt = moved(size, cell, action)
            if nxt not in seen and tiles[nxt] != "H":
                seen.add(nxt)
                stack.append(nxt)
    return False


def generate(rng, size, p):
    while True:
        tiles = ["F" if rng.random() < p else "H" for _ in range(size * size)]
        start = rng.randrange(size * size)
        goal = rng.randrange(size * size)
        while goal == start:
            goal = rng.randrange(size * size)
        tiles[start], tiles[goal] = "F", "G"
        if reachable(size, tiles, start):
            return tiles, start


def transitions(size):
    """P[cell, action, next]: the intended move or either perpendicular, 1/3 each."""
    n = size * size
    P = np.zeros((n, 4, n))
    for cell in range(n):
        for action in range(4):
            for turn in (0, 1, 3):
                P[cell, action, moved(size, cell, (action + turn) % 4)] += 1 / 3
    return P


def budget_success(P, terminal, goal_reward, policy, budget):
    """Success within `budget` actions for each start cell; policy None = optimal."""
    value = np.zeros(len(terminal))
    for _ in range(budget):
        landing = np.where(terminal, goal_reward, value)
        q = (P * landing[None, None, :]).sum(2)  # [cell, action]
        value = q.max(1) if policy is None else q[np.arange(len(terminal)), policy]
    return value


def discounted_policy(P, terminal, goal_reward, gamma, iterations):
    value = np.zeros(len(terminal))
    for _ in range(iterations):
        q = (P * (goal_reward + np.where(terminal, 0.0, gamma * value))[None, None, :]).sum(2)
        value = q.max(1)
    return q.argmax(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--maps", type=int, default=2000)
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--p", type=float, default=0.8)
    parser.add_argument("--budget", type=int, default=10)
    parser.add_argument("--gammas", type=float, nargs="+", default=[0.8, 0.9, 0.95, 0.99, 1.0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    P = transitions(args.size)
    optimal, by_gamma = 0.0, {g: 0.0 for g in args.gammas}
    for _ in range(args.maps):
        tiles, start = generate(rng, args.size, args.p)
        terminal = np.array([t in "HG" for t in tiles])
        goal_reward = np.array([1.0 if t == "G" else 0.0 for t in tiles])
        optimal += budget_success(P, terminal, goal_reward, None, args.budget)[start]
        for gamma in args.gammas:
            # gamma = 1 converges slowly where the goal is far; 200 sweeps settle a 4x4 map.
            policy = discounted_policy(P, terminal, goal_reward, gamma, 200)
            by_gamma[gamma] += budget_success(P, terminal, goal_reward, policy, args.budget)[start]
    print(f"best policy, success within {args.budget} actions: {optimal / args.maps:.1%}")
    for gamma in args.gammas:
        print(f"best stationary policy for gamma = {gamma}: {by_gamma[gamma] / args.maps:.1%}")


if __name__ == "__main__":
    main()
