// fmnist.h: the seed chapter's data, as the examples use it (dtrain-mnist, and
// dtrain-custom and dtrain-resnet, which include this file): where Fashion-MNIST is
// installed (Debian's dataset-fashion-mnist package) and the per-pixel normalisation
// of the seed script, x = (p / 255 - 0.1302) / 0.3069. The library knows neither: its
// dt_dataset_load_mnist reads the folder it is given, or $DT_DATA_DIR, and normalises
// with what dt_dataset_opts says (mean 0, std 1 by default).
#ifndef DTRAIN_EXAMPLES_FMNIST_H
#define DTRAIN_EXAMPLES_FMNIST_H

#include "dtrain/data.h"

#define FMNIST_DIR  "/usr/share/datasets/fashion-mnist"
#define FMNIST_MEAN 0.1302f
#define FMNIST_STD  0.3069f

// The folder to read: --data-dir when given, else $DT_DATA_DIR (NULL: the library reads
// it), else FMNIST_DIR.
static inline const char *fmnist_dir(const char *flag) {
    if (flag && *flag)
        return flag;
    return dt_setting_str("DT_DATA_DIR") ? NULL : FMNIST_DIR;
}

// Dataset options with the seed's normalisation.
static inline dt_dataset_opts fmnist_opts(void) {
    dt_dataset_opts o = dt_dataset_opts_default();
    o.mean            = FMNIST_MEAN;
    o.std             = FMNIST_STD;
    return o;
}

#endif // DTRAIN_EXAMPLES_FMNIST_H
