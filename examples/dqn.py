"""Lightning's DQN template (`reinforce_learn_Qnet.py`), ported to fitjax:
CartPole, a replay buffer, an epsilon-greedy agent and a target network synced
every `sync_rate` steps.

What moved where, against the Lightning original:

- The environment is stepped on the host, once per batch, in
  `on_train_batch_start` (Lightning's template steps it inside
  `training_step`; fitjax's `training_step` is traced once and compiled, so
  host work per step belongs in the host hooks, which run between steps as in
  Lightning). The agent's action comes from `self.net(state)`: host code calls
  the flax model with the trainer's current weights.
- The replay buffer feeds the loader: `RLDataset` samples batches from it, as
  the original's `IterableDataset` does; the batches are host numpy arrays.
- `self.target_net.load_state_dict(self.net.state_dict())` becomes
  `self.update_params(lambda p: {**p, "target_net": p["net"]})` in
  `on_train_batch_end`: the new weights join the train state (sharded,
  donated, checkpointed) before the next step.
- `self.net` and `self.target_net` are two flax models on the module, as in
  the original; the optimizer trains `net` only
  (`{"net": adam, "target_net": set_to_zero}`).

    python examples/dqn.py  # CartPole-v1: an episode return of 200 and more
                            # within ~4000 steps
"""

from __future__ import annotations

import argparse
import collections

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fitjax as fj


class DQN(nn.Module):
    """The template's Q network: observation -> one value per action."""

    n_actions: int
    hidden_size: int = 128

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.n_actions)(nn.relu(nn.Dense(self.hidden_size)(x)))


class ReplayBuffer:
    """The last `capacity` experiences `(state, action, reward, done, new_state)`."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.buffer: collections.deque = collections.deque(maxlen=capacity)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.buffer)

    def append(self, experience: tuple) -> None:
        self.buffer.append(experience)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        indices = self.rng.choice(len(self.buffer), batch_size, replace=False)
        states, actions, rewards, dones, next_states = zip(*(self.buffer[i] for i in indices))
        return {"state": np.asarray(states, np.float32), "action": np.asarray(actions, np.int32),
                "reward": np.asarray(rewards, np.float32), "done": np.asarray(dones, np.float32),
                "next_state": np.asarray(next_states, np.float32)}


class RLDataset:
    """An epoch of `sample_size // batch_size` batches sampled from the buffer as it grows."""

    def __init__(self, buffer: ReplayBuffer, sample_size: int, batch_size: int) -> None:
        self.buffer, self.sample_size, self.batch_size = buffer, sample_size, batch_size

    def __iter__(self):
        for _ in range(self.sample_size // self.batch_size):
            yield self.buffer.sample(self.batch_size)


class Agent:
    """Interacts with the environment; the Q network picks the greedy action."""

    def __init__(self, env: gym.Env, buffer: ReplayBuffer, seed: int = 0) -> None:
        self.env, self.buffer = env, buffer
        self.rng = np.random.default_rng(seed)
        self.state, _ = env.reset(seed=seed)

    def play_step(self, q_values, epsilon: float) -> tuple[float, bool]:
        """One environment step (epsilon-greedy on `q_values(state)`), stored in the buffer."""
        if self.rng.random() < epsilon:
            action = int(self.env.action_space.sample())
        else:
            action = int(np.argmax(q_values(self.state[None])[0]))
        new_state, reward, terminated, truncated, _ = self.env.step(action)
        self.buffer.append((self.state, action, reward, terminated, new_state))
        self.state = new_state
        if terminated or truncated:
            self.state, _ = self.env.reset()
        return float(reward), terminated or truncated


class DQNLightning(fj.LitModule):
    def __init__(self, batch_size: int = 16, lr: float = 1e-2, env: str = "CartPole-v1", gamma: float = 0.99,
                 sync_rate: int = 10, replay_size: int = 1000, warm_start_steps: int = 1000,
                 eps_last_frame: int = 1000, eps_start: float = 1.0, eps_end: float = 0.01,
                 episode_length: int = 200, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.env = gym.make(env)
        self.env.action_space.seed(seed)
        n_actions = int(self.env.action_space.n)
        self.net = DQN(n_actions)
        self.target_net = DQN(n_actions)
        self.buffer = ReplayBuffer(replay_size, seed)
        self.agent = Agent(self.env, self.buffer, seed)
        self.total_reward = 0.0
        self.episode_reward = 0.0
        self.returns: list[float] = []
        self.populate(warm_start_steps)

    def populate(self, steps: int) -> None:
        """Fills the buffer with random play before training (the template's warm start)."""
        for _ in range(steps):
            self.agent.play_step(None, epsilon=1.0)

    def training_step(self, batch, batch_idx):  # traced: the template's dqn_mse_loss
        q = jnp.take_along_axis(self.net(batch["state"]), batch["action"][:, None], axis=1)[:, 0]
        next_q = jax.lax.stop_gradient(self.target_net(batch["next_state"]).max(axis=1))
        expected = batch["reward"] + self.hparams.gamma * next_q * (1.0 - batch["done"])
        return jnp.mean((q - expected) ** 2)

    def on_train_batch_start(self, batch, batch_idx):  # host work per step: the environment
        hp = self.hparams
        epsilon = max(hp.eps_end, hp.eps_start - (self.global_step + 1) / hp.eps_last_frame)
        reward, done = self.agent.play_step(lambda s: np.asarray(self.net(s)), epsilon)
        self.episode_reward += reward
        if done:
            self.total_reward = self.episode_reward
            self.returns.append(self.episode_reward)
            self.episode_reward = 0.0

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step % self.hparams.sync_rate == 0:  # the template's target network sync
            self.update_params(lambda p: {**p, "target_net": p["net"]})
        self.log("total_reward", self.total_reward, prog_bar=True)

    def configure_optimizers(self):
        return {"net": optax.adam(self.hparams.lr), "target_net": optax.set_to_zero()}

    def train_dataloader(self):
        return RLDataset(self.buffer, self.hparams.episode_length, self.hparams.batch_size)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=4000)
    parser.add_argument("--root-dir", default="runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    module = DQNLightning()
    trainer = fj.Trainer(max_steps=args.max_steps, max_epochs=-1, default_root_dir=args.root_dir, logger=False,
                         enable_progress_bar=not args.no_progress_bar, enable_model_summary=False,
                         enable_checkpointing=False, devices=1, log_every_n_steps=100)
    trainer.fit(module)
    results = {"best_return": max(module.returns), "episodes": len(module.returns),
               "last_10_mean": float(np.mean(module.returns[-10:]))}
    print(f"{results['episodes']} episodes, best return {results['best_return']:.0f}, "
          f"mean of the last 10 {results['last_10_mean']:.1f}")
    return results


if __name__ == "__main__":
    main()
