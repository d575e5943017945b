"""Records Gymnasium trajectories that redco's environments must reproduce.

    python tests/python/make_env_goldens.py [--seed 0] [--out tests/goldens/rl_envs.txt]

Each episode starts from a state this script chooses (set on the unwrapped env
after reset, since redco draws its resets from Philox, not NumPy) and follows
actions fixed in advance (random, or a simple controller whose choices are
recorded). Long episodes are recorded in windows: the first steps, then the
steps up to the time limit, with a `start` line giving Gymnasium's state and
step count where a window begins.

Format, one record per line:
    env <name>
    start <elapsed steps> <state (float64, repr)...>
    step <action> <state after (float64)...> | <observation (float32, %.9g)...> | <reward> <terminated> <truncated>
"""

import argparse
import sys

import numpy as np

import gymnasium as gym

assert gym.__version__ == "1.0.0", f"goldens are defined against gymnasium 1.0.0, not {gym.__version__}"


def fmt_state(s):
    return " ".join(repr(float(v)) for v in s)


class Recorder:
    def __init__(self, out, name):
        self.out = out
        self.env = gym.make(name)
        self.name = name
        self.discrete = isinstance(self.env.action_space, gym.spaces.Discrete)
        out.write(f"env {name}\n")

    def episode(self, start, policy, windows, write=True):
        """Runs one episode from `start`; writes the steps whose index (1-based)
        falls in one of `windows` (list of (first, last)). Returns its length."""
        self.env.reset(seed=0)
        self.env.unwrapped.state = np.array(start, dtype=np.float64)
        t, recording = 0, False
        while True:
            state = np.array(self.env.unwrapped.state, dtype=np.float64)
            action = policy(t, state)
            t += 1
            inside = write and any(a <= t <= b for a, b in windows)
            if inside and not recording:
                self.out.write(f"start {t - 1} {fmt_state(state)}\n")
            recording = inside
            if self.discrete:
                obs, reward, term, trunc, _ = self.env.step(int(action))
                act = str(int(action))
            else:
                a = np.array([action], dtype=np.float32)
                obs, reward, term, trunc, _ = self.env.step(a)
                act = "%.9g" % a[0]
            if inside:
                o = " ".join("%.9g" % v for v in obs)
                after = fmt_state(self.env.unwrapped.state)
                self.out.write(f"step {act} {after} | {o} | {float(reward)!r} {int(term)} {int(trunc)}\n")
            if term or trunc:
                return t


def cartpole(out, rng):
    rec = Recorder(out, "CartPole-v1")
    # Random pushes until the pole falls.
    acts = rng.integers(0, 2, size=1000)
    rec.episode(rng.uniform(-0.05, 0.05, 4), lambda t, s: acts[t], [(1, 1000)])
    # A linear controller keeps it up to the 500-step limit (truncation).
    ctrl = lambda t, s: int(0.5 * s[0] + 1.0 * s[1] + 20 * s[2] + 3 * s[3] > 0)
    n = rec.episode(rng.uniform(-0.05, 0.05, 4), ctrl, [(1, 30), (481, 500)])
    assert n == 500, n
    # Pushed off the right edge of the track (|x| > 2.4).
    rec.episode([2.3, 0.5, 0.0, -0.1], lambda t, s: 1, [(1, 1000)])


def acrobot(out, rng):
    rec = Recorder(out, "Acrobot-v1")
    acts = rng.integers(0, 3, size=1000)
    n = rec.episode(rng.uniform(-0.1, 0.1, 4), lambda t, s: acts[t], [(1, 40), (481, 500)])
    assert n == 500, n
    # Torque along the second joint's velocity pumps energy until the tip clears the bar.
    pump = lambda t, s: 2 if s[3] > 0 else 0
    start = rng.uniform(-0.1, 0.1, 4)
    n = rec.episode(start, pump, [], write=False)
    assert n < 500, n
    rec.episode(start, pump, [(1, 30), (n - 30, n)])
    # Fast spins: angle wrapping and the velocity bounds (4 pi, 9 pi).
    for start in ([0.3, -0.2, 12.4, -28.0], [-2.9, 3.1, -12.5, 28.2], [3.1, -0.1, 0.0, 0.0]):
        rec.episode(start, lambda t, s: acts[t], [(1, 40)])


def pendulum(out, rng):
    rec = Recorder(out, "Pendulum-v1")
    acts = rng.uniform(-2, 2, size=1000).astype(np.float32)
    start = [rng.uniform(-np.pi, np.pi), rng.uniform(-1, 1)]
    rec.episode(start, lambda t, s: acts[t], [(1, 40), (181, 200)])
    # Full torque at high speed: the 8 rad/s clip and many turns of the angle.
    rec.episode([3.0, 7.9], lambda t, s: 2.0 if t % 7 else -2.0, [(1, 60)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="tests/goldens/rl_envs.txt")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    with open(args.out, "w") as out:
        out.write(f"# gymnasium {gym.__version__}, numpy {np.__version__}, seed {args.seed}: "
                  "written by tests/python/make_env_goldens.py\n")
        cartpole(out, rng)
        acrobot(out, rng)
        pendulum(out, rng)


if __name__ == "__main__":
    sys.exit(main())
