// dtrain.h: the umbrella header. Includes every public module of the library.
#ifndef DTRAIN_DTRAIN_H
#define DTRAIN_DTRAIN_H

#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"
#include "dtrain/dp.h"
#include "dtrain/graph.h"
#include "dtrain/launch.h"
#include "dtrain/layer.h"
#include "dtrain/mesh.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/params.h"
#include "dtrain/pipe.h"
#include "dtrain/rng.h"
#include "dtrain/tensor.h"
#include "dtrain/tp.h"
#include "dtrain/trace.h"
#include "dtrain/train.h"
#include "dtrain/zero.h"

#endif // DTRAIN_DTRAIN_H
