// PPO (clipped surrogate objective, GAE) on CartPole-v1 or Acrobot-v1 with
// redco's three functions. The model is two parts, an actor (action logits)
// and a critic (state value), each with its own Adam; every epoch collects
// fresh rollouts from the current policy (per_epoch) and makes --passes
// shuffled passes over them in minibatches.
//   build/samples/reinforcement_learning/ppo --env CartPole-v1 --workdir ppo_cartpole
#include <cmath>
#include <limits>
#include <optional>

#include "common.hpp"
#include "redco_cli.hpp"

using namespace redco;

struct Transition {
  std::array<float, 6> obs{};  // the first obs_dim used
  int64_t action = 0;
  float logp = 0, adv = 0, ret = 0;  // log pi_old(action | obs), GAE advantage, critic target
};
struct Batch {
  Tensor obs;                 // f32 [B, obs_dim]
  Tensor onehot;              // f32 [B, n_actions]: the action taken
  Tensor old_logp, adv, ret;  // f32 [B] each; adv normalised over the batch
};

int main(int argc, char** argv) try {
  cli::App app{"PPO on a discrete classic-control task"};
  std::string env_name = "CartPole-v1", workdir = "ppo_workdir";
  int64_t epochs = 150, n_envs = 8, horizon = 128, passes = 4, batch = 256, hidden = 64;
  int64_t eval_episodes = 100, print_every = 10;
  float lr = 2.5e-4f, critic_lr = 1e-3f, gamma = 0.99f, lambda = 0.95f, clip = 0.2f, ent = 0.01f;
  double min_return = -std::numeric_limits<double>::infinity();
  uint64_t seed = 1;
  app.add_option("--env", env_name, "CartPole-v1 or Acrobot-v1");
  app.add_option("--epochs", epochs, "rollout-and-update rounds")->check(cli::at_least(1));
  app.add_option("--envs", n_envs, "environments stepped together")->check(cli::at_least(1));
  app.add_option("--horizon", horizon, "steps per env per epoch")->check(cli::at_least(1));
  app.add_option("--passes", passes, "passes over each epoch's rollouts")->check(cli::at_least(1));
  app.add_option("--batch-size", batch, "transitions per update")->check(cli::at_least(1));
  app.add_option("--hidden", hidden, "width of the two tanh layers")->check(cli::at_least(1));
  app.add_option("--lr", lr, "actor Adam learning rate")->check(cli::positive());
  app.add_option("--critic-lr", critic_lr, "critic Adam learning rate")->check(cli::positive());
  app.add_option("--gamma", gamma, "discount")->check(cli::in_range(0, 1));
  app.add_option("--lambda", lambda, "GAE lambda")->check(cli::in_range(0, 1));
  app.add_option("--clip", clip, "PPO ratio clip")->check(cli::in_range(0, 1));
  app.add_option("--ent-coef", ent, "entropy bonus")->check(cli::non_negative());
  app.add_option("--eval-episodes", eval_episodes, "greedy episodes at the end")
      ->check(cli::at_least(1));
  app.add_option("--min-return", min_return, "exit 1 when the evaluation's mean is below");
  app.add_option("--print-every", print_every, "epochs between lines")->check(cli::at_least(1));
  app.add_option("--seed", seed);
  app.add_option("--workdir", workdir, "metrics.jsonl, TensorBoard events, returns.svg");
  REDCO_CLI_PARSE(app, argc, argv);

  // An unknown name: one error listing the tasks.
  const rl::EnvInfo info = rl::VectorEnv(env_name, 1, seed).info();
  REDCO_CHECK(info.n_actions > 0,
              "{} has continuous actions; this PPO samples discrete ones (CartPole-v1, "
              "Acrobot-v1); ddpg solves Pendulum-v1",
              env_name);
  const int64_t D = info.obs_dim, A = info.n_actions, T = horizon;
  REDCO_CHECK(batch <= n_envs * T, "--batch-size {} is more than an epoch's {} transitions", batch,
              n_envs * T);
  auto mlp = [&](int64_t out) {
    return nn::linear(D, hidden) | nn::tanh() | nn::linear(hidden, hidden) | nn::tanh() |
           nn::linear(hidden, out);
  };
  const auto model = nn::parts(nn::named<"actor">(mlp(A)), nn::named<"critic">(mlp(1)));

  auto collate = [&](std::span<const Transition> ts) {
    const auto B = int64_t(ts.size());
    Batch b{Tensor::empty({B, D}), Tensor::zeros({B, A}), Tensor::empty({B}), Tensor::empty({B}),
            Tensor::empty({B})};
    double mean = 0, sq = 0;
    for (const Transition& t : ts) mean += t.adv, sq += double(t.adv) * t.adv;
    mean /= double(B);
    const double std = std::sqrt(std::max(0.0, sq / double(B) - mean * mean)) + 1e-8;
    for (int64_t i = 0; i < B; ++i) {
      const Transition& t = ts[size_t(i)];
      std::copy_n(t.obs.begin(), D, b.obs.data<float>() + i * D);
      b.onehot.data<float>()[i * A + t.action] = 1.f;
      b.old_logp.data<float>()[i] = t.logp;
      b.adv.data<float>()[i] = float((t.adv - mean) / std);
      b.ret.data<float>()[i] = t.ret;
    }
    return b;
  };
  auto loss = [&](auto& m, const Batch& b, Rng) {
    const Tensor logp_all = log_softmax(part<"actor">(m)(b.obs));  // [B, A]
    const Tensor ratio = exp(sum(logp_all * b.onehot, {1}) - b.old_logp);
    const Tensor lo = Tensor::full(ratio.shape(), 1 - clip),
                 hi = Tensor::full(ratio.shape(), 1 + clip);
    const Tensor clipped = -maximum(-maximum(ratio, lo), -hi);
    const Tensor surrogate = -maximum(-(ratio * b.adv), -(clipped * b.adv));  // the min of the two
    const Tensor value = reshape(part<"critic">(m)(b.obs), {-1});
    const Tensor entropy = -mean(sum(exp(logp_all) * logp_all, {1}));
    return -mean(surrogate) + 0.5f * mean(square(value - b.ret)) - ent * entropy;
  };
  auto predict = [](auto& m, const Batch& b, Rng) {  // the greedy action
    return argmax(part<"actor">(m)(b.obs), 1).template values<int64_t>();
  };

  // This process's envs and rollout buffers, [T, N] (obs [T, N, D]), made by the first epoch.
  std::optional<rl::VectorEnv> own_envs;
  std::vector<float> obs, rew, val, next_val, logp, adv, ret;
  std::vector<int64_t> act;
  std::vector<uint8_t> term, ends;
  rl_sample::Returns returns;
  const int64_t steps_per_epoch = Deployer::steps_per_epoch(passes * n_envs * T, batch);
  Deployer deployer({.seed = seed, .workdir = workdir});
  // Each data-parallel replica steps its own share of the --envs environments
  // (count = its share of the transitions) with its own seed; episodes run on
  // across epochs: each epoch continues the envs where the last one stopped.
  auto rollouts = [&](int64_t epoch, auto& policy, Rng rng, int64_t count) {
    REDCO_CHECK(count % T == 0, "--envs {} do not split evenly over the data-parallel processes",
                n_envs);
    const int64_t N = count / T;
    if (!own_envs) {
      const Rng r = rng.split("envs");
      own_envs.emplace(env_name, N, uint64_t(r.bits(0)) << 32 | r.bits(1));
      for (auto* v : {&obs, &rew, &val, &next_val, &logp, &adv, &ret})
        v->resize(size_t(T * N * (v == &obs ? D : 1)));
      act.resize(size_t(T * N)), term.resize(size_t(T * N)), ends.resize(size_t(T * N));
    }
    rl::VectorEnv& envs = *own_envs;
    auto actor = part<"actor">(policy);
    auto critic = part<"critic">(policy);
    auto values = [&](std::span<const float> o, auto&& use) {  // the critic on [N, D] observations
      const Tensor v = critic(Tensor::from(o, {N, D}));
      for (int64_t i = 0; i < N; ++i) use(i, v.data<float>()[i]);
    };
    for (int64_t t = 0; t < T; ++t) {
      const auto k = [&](int64_t i) { return size_t(t * N + i); };
      const std::span<const float> o = envs.observations();
      std::copy(o.begin(), o.end(), obs.begin() + t * N * D);
      const Tensor lp = log_softmax(actor(Tensor::from(o, {N, D})));  // [N, A]
      for (int64_t i = 0; i < N; ++i) {                               // sample by inverse CDF
        const float* row = lp.data<float>() + i * A;
        double u = rng.uniform01(uint64_t(k(i))), cdf = 0;
        int64_t a = 0;
        while (a < A - 1 && (cdf += std::exp(double(row[a]))) <= u) ++a;
        act[k(i)] = a, logp[k(i)] = row[a];
      }
      values(o, [&](int64_t i, float v) {
        val[k(i)] = v;
        if (t > 0 && !ends[k(i) - size_t(N)]) next_val[k(i) - size_t(N)] = v;
      });
      envs.step(std::span<const int64_t>(act).subspan(k(0), size_t(N)));
      bool truncated = false;
      for (int64_t i = 0; i < N; ++i) {
        rew[k(i)] = envs.rewards()[size_t(i)];
        term[k(i)] = envs.terminated()[size_t(i)], ends[k(i)] = envs.done(i);
        truncated |= envs.truncated()[size_t(i)] && !term[k(i)];
      }
      // A truncated episode is bootstrapped from the value of its last observation.
      if (truncated)
        values(envs.final_observations(), [&](int64_t i, float v) { next_val[k(i)] = v; });
      returns.collect(envs);
    }
    values(envs.observations(), [&](int64_t i, float v) {
      if (!ends[size_t((T - 1) * N + i)]) next_val[size_t((T - 1) * N + i)] = v;
    });
    rl::gae({rew, val, next_val, term, ends, N}, {.gamma = gamma, .lambda = lambda}, adv, ret);
    returns.epoch_done(deployer, epoch, epoch * steps_per_epoch, (epoch + 1) * n_envs * T,
                       print_every);
    std::vector<Transition> out(size_t(N * T));
    for (size_t j = 0; j < out.size(); ++j) {
      std::copy_n(obs.begin() + int64_t(j) * D, D, out[j].obs.begin());
      out[j].action = act[j], out[j].logp = logp[j], out[j].adv = adv[j], out[j].ret = ret[j];
    }
    return out;
  };

  Trainer trainer(
      deployer, model, collate, loss,
      ParamGroups()
          .train("actor", optim::adam(optim::linear(lr, 0.f, epochs * steps_per_epoch),
                                      {.eps = 1e-5f, .max_grad_norm = 0.5f}))
          .train("critic", optim::adam(optim::linear(critic_lr, 0.f, epochs * steps_per_epoch),
                                       {.eps = 1e-5f, .max_grad_norm = 0.5f})));
  trainer.fit(
      per_epoch(n_envs * T, rollouts, {.passes = passes, .per_replica = true}),
      {.global_batch_size = batch, .n_epochs = epochs, .log_every = steps_per_epoch * print_every});
  returns.plot(deployer, fmt::format("PPO on {}", env_name));

  Predictor predictor(deployer, model, collate, predict);
  return rl_sample::evaluate_policy<Transition>(deployer, trainer, predictor, env_name,
                                                eval_episodes, seed + 1, epochs * steps_per_epoch,
                                                "greedy", min_return);
} catch (const std::exception& e) {
  fmt::print(stderr, "ppo: {}\n", e.what());
  return 1;
}
