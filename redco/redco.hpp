#pragma once
// Everything a redco program needs, in one include.
#include "redco/autodiff/functional.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/core/allocator.hpp"
#include "redco/core/philox.hpp"
#include "redco/core/tensor.hpp"
#include "redco/data/idx.hpp"
#include "redco/nn/model.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/optim/schedule.hpp"
#include "redco/shard/plan.hpp"
