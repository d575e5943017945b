// DDPG (deterministic policy gradient with target networks) on Pendulum-v1
// with redco's three functions. Four parts: actor and critic, each with its
// own Adam, and their target copies, frozen and moved towards them by
// Polyak averaging after every step (ParamGroups). Every epoch the current
// actor plus Gaussian noise collects more transitions into a replay buffer
// and the epoch's examples are minibatches drawn from it (per_epoch). A
// custom step takes the critic's gradient from the TD loss and the actor's
// from the policy objective -Q(s, actor(s)) alone.
//   build/samples/reinforcement_learning/ddpg --workdir ddpg_pendulum
#include <cmath>
#include <limits>
#include <optional>

#include "common.hpp"
#include "redco_cli.hpp"

using namespace redco;

struct Transition {
  std::array<float, 3> obs{}, next_obs{};
  float action = 0, reward = 0;
  bool terminal = false;  // the task ended the episode (Pendulum never does; truncation bootstraps)
};
struct Batch {
  Tensor obs, next_obs;    // f32 [B, 3]
  Tensor action;           // f32 [B, 1]
  Tensor reward, not_end;  // f32 [B] each; not_end = 1 - terminal
};

int main(int argc, char** argv) try {
  cli::App app{"DDPG on Pendulum-v1"};
  std::string env_name = "Pendulum-v1", workdir = "ddpg_workdir";
  int64_t epochs = 100, n_envs = 4, horizon = 50, warmup = 2000, buffer = 100000, batch = 128;
  int64_t hidden = 64, eval_episodes = 100, print_every = 10;
  float lr = 1e-3f, critic_lr = 1e-3f, gamma = 0.99f, tau = 0.005f, noise = 0.1f;
  double min_return = -std::numeric_limits<double>::infinity();
  uint64_t seed = 1;
  app.add_option("--env", env_name, "a continuous task: Pendulum-v1");
  app.add_option("--epochs", epochs, "collect-and-update rounds")->check(cli::at_least(1));
  app.add_option("--envs", n_envs, "environments stepped together")->check(cli::at_least(1));
  app.add_option("--horizon", horizon, "steps per env per epoch (one update per env step)")
      ->check(cli::at_least(1));
  app.add_option("--warmup", warmup, "random-action env steps before the first epoch's updates")
      ->check(cli::at_least(0));
  app.add_option("--buffer", buffer, "replay buffer capacity")->check(cli::at_least(1));
  app.add_option("--batch-size", batch, "transitions per update")->check(cli::at_least(1));
  app.add_option("--hidden", hidden, "width of the two ReLU layers")->check(cli::at_least(1));
  app.add_option("--lr", lr, "actor Adam learning rate")->check(cli::positive());
  app.add_option("--critic-lr", critic_lr, "critic Adam learning rate")->check(cli::positive());
  app.add_option("--gamma", gamma, "discount")->check(cli::in_range(0, 1));
  app.add_option("--tau", tau, "Polyak rate of the target networks")->check(cli::in_range(0, 1));
  app.add_option("--noise", noise, "exploration noise, as a fraction of the largest action")
      ->check(cli::non_negative());
  app.add_option("--eval-episodes", eval_episodes, "noise-free episodes at the end")
      ->check(cli::at_least(1));
  app.add_option("--min-return", min_return, "exit 1 when the evaluation's mean is below");
  app.add_option("--print-every", print_every, "epochs between lines")->check(cli::at_least(1));
  app.add_option("--seed", seed);
  app.add_option("--workdir", workdir, "metrics.jsonl, TensorBoard events, returns.svg");
  REDCO_CLI_PARSE(app, argc, argv);

  // An unknown name: one error listing the tasks.
  const rl::EnvInfo info = rl::VectorEnv(env_name, 1, seed).info();
  REDCO_CHECK(info.action_dim == 1 && info.obs_dim == 3,
              "{} has discrete actions; DDPG needs a continuous one (Pendulum-v1); ppo solves "
              "CartPole-v1 and Acrobot-v1",
              env_name);
  const int64_t D = info.obs_dim;
  const float max_action = info.action_high;
  auto actor = nn::linear(D, hidden) | nn::relu() | nn::linear(hidden, hidden) | nn::relu() |
               nn::linear(hidden, 1) | nn::tanh();  // times max_action
  auto critic = nn::linear(D + 1, hidden) | nn::relu() | nn::linear(hidden, hidden) | nn::relu() |
                nn::linear(hidden, 1);
  const auto model =
      nn::parts(nn::named<"actor">(actor), nn::named<"critic">(critic),
                nn::named<"target_actor">(actor), nn::named<"target_critic">(critic));

  auto collate = [&](std::span<const Transition> ts) {
    const auto B = int64_t(ts.size());
    Batch b{Tensor::empty({B, D}), Tensor::empty({B, D}), Tensor::empty({B, 1}), Tensor::empty({B}),
            Tensor::empty({B})};
    for (int64_t i = 0; i < B; ++i) {
      const Transition& t = ts[size_t(i)];
      std::copy_n(t.obs.begin(), D, b.obs.data<float>() + i * D);
      std::copy_n(t.next_obs.begin(), D, b.next_obs.data<float>() + i * D);
      b.action.data<float>()[i] = t.action;
      b.reward.data<float>()[i] = t.reward;
      b.not_end.data<float>()[i] = t.terminal ? 0.f : 1.f;
    }
    return b;
  };
  auto q = [](auto&& critic, const Tensor& obs, const Tensor& action) {  // [B]
    return reshape(critic(concat({obs, action}, 1)), {-1});
  };
  auto critic_loss = [&](auto& m, const Batch& b) {  // TD error against the target networks
    const Tensor next = part<"target_actor">(m)(b.next_obs) * max_action;
    const Tensor y = b.reward + gamma * b.not_end * q(part<"target_critic">(m), b.next_obs, next);
    return mean(square(q(part<"critic">(m), b.obs, b.action) - y));
  };
  auto actor_loss = [&](auto& m, const Batch& b) {
    return -mean(q(part<"critic">(m), b.obs, part<"actor">(m)(b.obs) * max_action));
  };
  auto loss = [&](auto& m, const Batch& b, Rng) { return critic_loss(m, b) + actor_loss(m, b); };
  auto predict = [&](auto& m, const Batch& b, Rng) {  // the noise-free action
    return (part<"actor">(m)(b.obs) * max_action).template values<float>();
  };
  // The actor's objective must not train the critic: each part's gradient from its own term.
  auto step = [&](auto& s, const Batch& b, Rng) {  // s: StepContext of the model
    auto [lc, gc] = s.value_and_grad([&](auto& m) { return critic_loss(m, b); });
    auto [la, ga] = s.value_and_grad([&](auto& m) { return actor_loss(m, b); });
    for (auto& [name, g] : gc)
      if (name.starts_with("actor.")) g = ga.at(name);
    return StepResult{lc + la, gc};
  };

  // The replay buffer: a ring of the last `buffer` transitions.
  std::vector<Transition> replay;
  int64_t next_slot = 0, env_steps = 0;   // env steps of all processes
  std::optional<rl::VectorEnv> own_envs;  // this process's share of the --envs environments
  std::vector<float> actions;
  rl_sample::Returns returns;
  const int64_t updates = n_envs * horizon;  // steps per epoch
  Deployer deployer({.seed = seed, .workdir = workdir});
  auto collect = [&](auto& policy, Rng rng, bool random) {  // one step of every env
    rl::VectorEnv& envs = *own_envs;
    const int64_t N = envs.size();
    const std::span<const float> o = envs.observations();
    if (random) {
      for (int64_t i = 0; i < N; ++i)
        actions[size_t(i)] = float(max_action * (2 * rng.uniform01(uint64_t(i)) - 1));
    } else {
      const Tensor a = part<"actor">(policy)(Tensor::from(o, {N, D}));  // [N, 1]
      const Tensor eps = rng.normal({N}, 0.f, noise * max_action);
      for (int64_t i = 0; i < N; ++i)
        actions[size_t(i)] = std::clamp(a.data<float>()[i] * max_action + eps.data<float>()[i],
                                        -max_action, max_action);
    }
    std::vector<Transition> ts(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) std::copy_n(o.begin() + i * D, D, ts[size_t(i)].obs.begin());
    envs.step(std::span<const float>(actions));
    for (int64_t i = 0; i < N; ++i) {
      Transition& t = ts[size_t(i)];
      const auto& next = envs.done(i) ? envs.final_observations() : envs.observations();
      std::copy_n(next.begin() + i * D, D, t.next_obs.begin());
      t.action = actions[size_t(i)], t.reward = envs.rewards()[size_t(i)];
      t.terminal = envs.terminated()[size_t(i)];
      if (int64_t(replay.size()) < buffer)
        replay.push_back(t);
      else
        replay[size_t(next_slot)] = t;
      next_slot = (next_slot + 1) % buffer;
    }
    returns.collect(envs);
    env_steps += n_envs;
  };
  // Epoch e: more transitions (epoch 0 first adds `warmup` random ones), then
  // `updates` minibatches drawn uniformly from the buffer.
  // Each data-parallel replica steps its own envs into its own buffer and
  // draws its share (count) of the minibatches from it.
  auto examples = [&](int64_t epoch, auto& policy, Rng rng, int64_t count) {
    REDCO_CHECK(count % (horizon * batch) == 0,
                "--envs {} do not split evenly over the data-parallel processes", n_envs);
    if (!own_envs) {
      const Rng r = rng.split("envs");
      own_envs.emplace(env_name, count / (horizon * batch), uint64_t(r.bits(0)) << 32 | r.bits(1));
      actions.resize(size_t(own_envs->size()));
    }
    for (int64_t t = 0; epoch == 0 && t * n_envs < warmup; ++t)
      collect(policy, rng.split("warmup").split(uint64_t(t)), true);
    for (int64_t t = 0; t < horizon; ++t)
      collect(policy, rng.split("explore").split(uint64_t(t)), false);
    returns.epoch_done(deployer, epoch, epoch * updates, env_steps, print_every);
    std::vector<Transition> out(static_cast<size_t>(count));
    const Rng draw = rng.split("draw");
    for (size_t j = 0; j < out.size(); ++j)
      out[j] = replay[size_t(draw.uniform01(j) * double(replay.size()))];
    return out;
  };

  Trainer trainer(deployer, model, collate, loss,
                  ParamGroups()
                      .train("actor", optim::adam(lr))
                      .train("critic", optim::adam(critic_lr))
                      .freeze("target_actor")
                      .freeze("target_critic")
                      .polyak("target_actor", "actor", tau)
                      .polyak("target_critic", "critic", tau));
  trainer.fit(per_epoch(updates * batch, examples, {.per_replica = true}),
              {.global_batch_size = batch,
               .n_epochs = epochs,
               .shuffle = false,
               .log_every = updates * print_every},
              step);
  returns.plot(deployer, fmt::format("DDPG on {}", env_name));

  Predictor predictor(deployer, model, collate, predict);
  return rl_sample::evaluate_policy<Transition>(deployer, trainer, predictor, env_name,
                                                eval_episodes, seed + 1, epochs * updates,
                                                "noise-free", min_return);
} catch (const std::exception& e) {
  fmt::print(stderr, "ddpg: {}\n", e.what());
  return 1;
}
