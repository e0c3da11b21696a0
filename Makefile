# dtrain: one GNU Makefile. Sources are found by wildcard, so a new file in src/<module>/
# or one folder below it (src/comm/tcp/), tests/<group>/test_*.c, fuzz/fuzz_*.c or bench/
# needs no edit here. The MPI backend's files are those under src/comm/mpi/.
#
#   make                 library (static + shared) and programs into build/bin/
#   make run             install what is missing, build, train the ConvNet on 2 processes
#   make test            install what is missing, build, run every test
#   make asan            the tests under AddressSanitizer and UBSan together (CI)
#   make ubsan           the tests under UndefinedBehaviorSanitizer alone
#   make tsan            the threaded tests under ThreadSanitizer
#   make test-slow       the long fault matrices (hung peers, cut links; ~10 min), and
#                        world invariance with --invariant 0 for comparison
#   make fuzz            libFuzzer targets (clang); make fuzz-run FUZZ_SECONDS=20
#   make bench           benchmarks against the PyTorch peer and Open MPI
#   make dnnl-bench      oneDNN's convolutions against dtrain's (where libdnnl-dev is)
#   make golden          rewrite tests/golden/data/ from PyTorch (tests/golden/README.md)
#   make test-gpu        the GPU tests (tests/gpu/; "no GPU" and success where none is found)
#   make cross-arm64     library, programs and tests for arm64 (aarch64-linux-gnu-gcc) into
#                        build/arm64/; make test-arm64 builds and runs the kernel, golden and
#                        gradient tests and a 2-process training run under qemu-aarch64
#   make install PREFIX=/usr/local
#   make install-check   install into a temporary prefix, build and run a program there
#
# Variables: BUILD=release|debug|asan|ubsan|tsan, NATIVE=1 (add -march=native),
# EXTRA_CFLAGS / EXTRA_LDFLAGS (added to the compiler's and linker's flags: headers and
# libraries from elsewhere, tools/gpu/pack.sh's folder), CUDA_INC_DIRS / CUDA_LIB_DIRS
# (more folders for the plugin's CUDA headers and libraries: cuBLAS or NCCL outside
# CUDA_HOME),
# MPI=auto|0|1, CUDA=auto|0|1 (the CUDA plugin: auto builds it in release builds where
# nvcc is found), DNNL=auto|0 (oneDNN's convolutions where libdnnl-dev is installed,
# release and debug builds), CUDA_ARCH="80 90" (the sm_ targets it is compiled for),
# NODEPS=1 (skip the package check), V=1 (show commands). No BLAS library: dtrain's own GEMM
# (src/kernels/gemm.h) runs on every CPU.
#
# CUDA is a plugin, not a dependency: src/cuda/ builds into $(OUT)/lib/libdtrain_cuda.so,
# linked against the CUDA libraries and not against libdtrain; the library loads it
# with dlopen when a "cuda" device is first asked for (docs/gpu.md), so every program
# runs where no CUDA library is installed.
#
# Portability: the baseline is plain x86-64 so the binaries run on any x86-64 CPU. The
# hot loops are kernels (src/kernels): the vector kernels of src/kernels/vec are compiled
# once per target, each target folder with its instruction set, and the kernel table
# picks at run time from what the CPU has, capped by DT_ISA (docs/kernels.md).
# NATIVE=1 compiles everything for the build machine instead.

BUILD  ?= release
CC     ?= gcc
CROSS  ?=
PREFIX ?= /usr/local
MPI    ?= auto
CUDA   ?= auto

ifeq ($(V),1)
Q :=
else
Q := @
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wpointer-arith -Wformat=2 -Wundef -Wvla -Wcast-qual -Wno-format-nonliteral -Wno-psabi
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -ffp-contract=fast -fno-math-errno -g -fPIC -fvisibility=hidden -Iinclude -Isrc \
               -MMD -MP $(WARN) -pthread
OPT := -O2

ifeq ($(BUILD),release)
  OUT := build/release
  BIN := build/bin
else ifeq ($(BUILD),debug)
  OUT := build/debug
  BIN := build/debug/bin
  OPT := -O0 -DDT_DEBUG_BUILD
else ifeq ($(BUILD),asan)
  OUT := build/asan
  BIN := build/asan/bin
  OPT := -O2 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
         -DDT_SANITIZE=1
  SAN_LDFLAGS := -fsanitize=address,undefined
else ifeq ($(BUILD),ubsan)
  OUT := build/ubsan
  BIN := build/ubsan/bin
  OPT := -O2 -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DDT_SANITIZE=1
  SAN_LDFLAGS := -fsanitize=undefined
else ifeq ($(BUILD),tsan)
  OUT := build/tsan
  BIN := build/tsan/bin
  OPT := -O2 -fsanitize=thread -DDT_SANITIZE=1
  SAN_LDFLAGS := -fsanitize=thread
else
  $(error BUILD must be release, debug, asan, ubsan or tsan; found "$(BUILD)")
endif

ifeq ($(NATIVE),1)
  OPT += -march=native -DDT_NATIVE
endif

# Cross builds (CROSS=arm64: `make cross-arm64`, `make test-arm64`): Debian's
# aarch64-linux-gnu-gcc against the arm64 multiarch libraries (libdeflate-dev:arm64,
# zlib1g-dev:arm64), into build/arm64/ (build/arm64-debug/ for BUILD=debug), without MPI,
# CUDA or oneDNN (the host's libdnnl-dev is x86's).
ifeq ($(CROSS),arm64)
  CC   := aarch64-linux-gnu-gcc
  MPI  := 0
  CUDA := 0
  DNNL := 0
  OUT  := build/arm64$(if $(filter release,$(BUILD)),,-$(BUILD))
  BIN  := $(OUT)/bin
else ifneq ($(CROSS),)
  $(error CROSS must be arm64 or empty; found "$(CROSS)")
endif
MACHINE := $(shell $(CC) -dumpmachine)
# Floating-point contraction. The ref target means the same arithmetic on every machine:
# a multiply and an add rounded separately, as baseline x86-64 (which has no FMA) does.
# arm64's baseline has FMA, so there the whole build is compiled without contraction and
# only the neon target's kernels (KFLAGS_neon) contract, as avx2 and up do on x86-64.
# (-fno-builtin-fmax/fmin: GCC 12, Debian 12's, fails with an internal error vectorising
# a loop of double fmax(acc, fabs(float)) on arm64; as library calls they are left alone.)
ifneq ($(filter aarch64%,$(MACHINE)),)
  BASE_CFLAGS := $(subst -ffp-contract=fast,-ffp-contract=off,$(BASE_CFLAGS)) \
                 -fno-builtin-fmax -fno-builtin-fmin
endif

CFLAGS  ?=
CFLAGS  := $(BASE_CFLAGS) $(OPT) $(CFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := -ldeflate -lz -lm -lpthread -ldl
LDFLAGS := $(SAN_LDFLAGS) -pthread $(EXTRA_LDFLAGS)

# ---------------------------------------------------------------- optional parts
MPICC := $(shell command -v mpicc 2>/dev/null)
ifeq ($(MPI),0)
  HAVE_MPI := 0
else ifneq ($(MPICC),)
  HAVE_MPI := 1
else ifeq ($(MPI),1)
  $(error MPI=1 but no mpicc was found; install libopenmpi-dev)
else
  HAVE_MPI := 0
endif
ifeq ($(MAKELEVEL)$(filter clean help format format-check,$(MAKECMDGOALS)),0)
  ifeq ($(HAVE_MPI),1)
    $(info dtrain: mpi backend built ($(MPICC)))
  else
    $(info dtrain: mpi backend left out ($(if $(filter 0,$(MPI)),MPI=0,no mpicc found: apt-get install libopenmpi-dev)))
  endif
endif
comma := ,
empty :=
space := $(empty) $(empty)
# CUDA: nvcc on PATH, else under CUDA_HOME (default /usr/local/cuda). The sanitizer
# builds stay CPU-only (their runtimes and CUDA's do not mix).
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc))
CUDA_ARCH ?= 80 90
ifneq ($(filter $(BUILD),release debug),)
  ifeq ($(CUDA),0)
    HAVE_CUDA := 0
  else ifneq ($(NVCC),)
    HAVE_CUDA := 1
  else ifeq ($(CUDA),1)
    $(error CUDA=1 but no nvcc was found on PATH or in $(CUDA_HOME)/bin)
  else
    HAVE_CUDA := 0
  endif
else
  HAVE_CUDA := 0
endif
ifeq ($(MAKELEVEL)$(filter clean help format format-check,$(MAKECMDGOALS)),0)
  ifeq ($(HAVE_CUDA),1)
    $(info dtrain: cuda plugin built ($(NVCC), sm_$(subst $(space),$(comma) sm_,$(strip $(CUDA_ARCH)))))
  else
    $(info dtrain: cuda plugin left out ($(if $(filter 0,$(CUDA)),CUDA=0,$(if $(filter $(BUILD),release debug),no nvcc found,BUILD=$(BUILD) is CPU-only))))
  endif
endif

# Open MPI's wrapper answers --showme:compile/--showme:link, MPICH's -compile_info and
# -link_info (a whole command line: only the flags are kept). Another MPI: MPICC=...
ifeq ($(HAVE_MPI),1)
  MPI_CC_INFO := $(shell $(MPICC) --showme:compile 2>/dev/null || $(MPICC) -compile_info 2>/dev/null)
  MPI_LD_INFO := $(shell $(MPICC) --showme:link 2>/dev/null || $(MPICC) -link_info 2>/dev/null)
  MPI_CFLAGS  := $(filter -I% -D% -pthread,$(MPI_CC_INFO)) -DDT_HAVE_MPI=1
  MPI_LIBS    := $(filter -L% -l% -Wl% -pthread,$(MPI_LD_INFO))
endif

# ---------------------------------------------------------------- sources
# Sorted by path, which fixes the archive's member order (src/comm/backends.c says why
# that order matters).
LIB_SRC  := $(sort $(filter-out src/cuda/%,$(wildcard src/*/*.c src/*/*/*.c)))
MPI_SRC  := $(filter src/comm/mpi/%.c,$(LIB_SRC))
# Kernels per target (src/kernels/<target>/): each folder is built for its instruction
# set and only runs where the CPU has it and DT_ISA allows it (kernels/table.c decides);
# another machine family's folders are left out. amx adds only the tile instructions to
# the baseline: its file also holds a software model of the tiles that runs anywhere.
X86_KERNELS       := avx2 avx512 avx512bf16 amx
ARM_KERNELS       := neon
KFLAGS_avx2       := -march=x86-64-v3 -mtune=generic
KFLAGS_avx512     := -march=x86-64-v4 -mtune=generic
KFLAGS_avx512bf16 := -march=x86-64-v4 -mavx512bf16 -mtune=generic
KFLAGS_amx        := -mamx-tile -mamx-bf16
KFLAGS_neon       := -ffp-contract=fast
KERNEL_FLAGS       = $(foreach t,$(X86_KERNELS) $(ARM_KERNELS),$(if $(filter src/kernels/$t/%,$1),$(KFLAGS_$t)))
# The vector kernels (src/kernels/vec/*.c) are written once and compiled once per target
# of the machine's family, -DDT_KVEC=<target> naming each object's functions.
VEC_SRC     := $(filter src/kernels/vec/%,$(LIB_SRC))
LIB_SRC     := $(filter-out $(VEC_SRC),$(LIB_SRC))
ifneq ($(filter x86_64%,$(MACHINE)),)
  VEC_TARGETS := ref avx2 avx512
  LIB_SRC     := $(filter-out $(ARM_KERNELS:%=src/kernels/%/%),$(LIB_SRC))
else ifneq ($(filter aarch64%,$(MACHINE)),)
  VEC_TARGETS := ref neon
  LIB_SRC     := $(filter-out $(X86_KERNELS:%=src/kernels/%/%),$(LIB_SRC))
else
  VEC_TARGETS := ref
  LIB_SRC     := $(filter-out $(X86_KERNELS:%=src/kernels/%/%) $(ARM_KERNELS:%=src/kernels/%/%),$(LIB_SRC))
endif
VEC_FLAGS    = -DDT_KVEC=$1 $(if $(filter ref,$1),,$(KFLAGS_$1))
VEC_OBJ      = $(foreach t,$(VEC_TARGETS),$(VEC_SRC:%.c=$1/%.$t.o))
ifneq ($(HAVE_MPI),1)
  LIB_SRC := $(filter-out $(MPI_SRC),$(LIB_SRC))
endif
# oneDNN (src/kernels/dnnl: its convolutions as provider rows of the kernel table, chosen
# per shape by measurement): built where its header is found, unless DNNL=0. The
# sanitizer builds leave it out (its JIT code and OpenMP runtime are not instrumented).
DNNL     ?= auto
DNNL_SRC := $(filter src/kernels/dnnl/%.c,$(LIB_SRC))
ifeq ($(DNNL)$(filter release debug,$(BUILD))$(wildcard /usr/include/oneapi/dnnl/dnnl.h),auto$(BUILD)/usr/include/oneapi/dnnl/dnnl.h)
  DNNL_CFLAGS := -DDT_HAVE_DNNL=1
  DNNL_LIBS   := -ldnnl -lgomp
else
  LIB_SRC := $(filter-out $(DNNL_SRC),$(LIB_SRC))
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(OUT)/obj/%.o) $(call VEC_OBJ,$(OUT)/obj)
LIB_A    := $(OUT)/lib/libdtrain.a
LIB_SO   := $(OUT)/lib/libdtrain.so
# The ABI version: bumped with every incompatible change of the public headers (CHANGES.md).
SONAME   := libdtrain.so.1

TESTLIB_SRC := $(sort $(wildcard tests/lib/*.c))
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=$(OUT)/obj/%.o)
TEST_SRC    := $(sort $(filter-out tests/gpu/%,$(wildcard tests/*/test_*.c)))
ifneq ($(HAVE_MPI),1)
  TEST_SRC := $(filter-out tests/mpi/%,$(TEST_SRC))
endif
TEST_BIN    := $(TEST_SRC:tests/%.c=$(OUT)/tests/%)
# Tests with threads of their own, run again under ThreadSanitizer.
TSAN_TESTS  := $(filter $(OUT)/tests/comm/% $(OUT)/tests/ddp/% $(OUT)/tests/data/% \
                 $(OUT)/tests/grad/% $(OUT)/tests/unit/test_model% \
                 $(OUT)/tests/unit/test_graph% $(OUT)/tests/parallel/test_zero3,$(TEST_BIN))

# The CUDA plugin (src/cuda/): .cu files by nvcc, .c files by $(CC) against CUDA's C
# headers, linked by nvcc into a library that needs nothing of libdtrain (the host
# functions it calls come in a table when it is loaded: src/core/device_abi.h).
# -Werror for both: nvcc's own warnings and the host compiler's.
CUDA_SRC      := $(sort $(wildcard src/cuda/*.cu src/cuda/*.c))
CUDA_OBJ      := $(patsubst %,$(OUT)/obj/%.o,$(CUDA_SRC))
CUDA_PLUGIN   := $(OUT)/lib/libdtrain_cuda.so
CUDA_SONAME   := libdtrain_cuda.so.1
CUDA_GENCODE  := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$a$(comma)code=sm_$a)
CUDA_INC      := $(foreach d,$(CUDA_INC_DIRS),-isystem $d) -isystem $(CUDA_HOME)/include
CUDA_CFLAGS   := $(filter-out -fvisibility=hidden,$(CFLAGS)) -fvisibility=hidden $(CUDA_INC)
# Warnings are errors here (NVCC_WERROR= and NVCC_HOST_WARN=-Wall,-Wextra relax them for a
# compiler newer than the code has met: tools/gpu/check.sh's build on another machine).
NVCC_WERROR    ?= --Werror all-warnings
NVCC_HOST_WARN ?= -Wall,-Wextra,-Werror
NVCC_FLAGS    := -std=c++17 $(CUDA_GENCODE) -O3 -lineinfo -Iinclude -Isrc $(CUDA_INC) \
                 -D_GNU_SOURCE -Xcompiler -fPIC,-fvisibility=hidden,$(NVCC_HOST_WARN) \
                 $(NVCC_WERROR) -MMD -MP
CUDA_LIBS     := $(foreach d,$(CUDA_LIB_DIRS),-L$d) -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lnccl \
                 -lcudart_static -ldl -lrt -lpthread
ifneq ($(HAVE_CUDA),1)
  CUDA_OBJ    :=
  CUDA_PLUGIN :=
endif
GPU_TEST_SRC := $(if $(CUDA_PLUGIN),$(sort $(wildcard tests/gpu/test_*.c)))
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/%.c=$(OUT)/tests/%)

$(OUT)/obj/src/cuda/%.cu.o: src/cuda/%.cu $(OUT)/flags
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(OUT)/obj/src/cuda/%.c.o: src/cuda/%.c $(OUT)/flags
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CUDA_CFLAGS) -c $< -o $@

$(OUT)/lib/libdtrain_cuda.so: $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVLD    $@")
	$(Q)$(NVCC) -shared $(CUDA_GENCODE) -Xlinker -soname=$(CUDA_SONAME) -Xlinker --no-undefined \
	    -o $@ $^ $(CUDA_LIBS)

# Programs: one folder each, all its .c files linked with the library.
# Every folder of examples/, tools/ and bench/ with C files is a program: examples/NAME
# builds as dtrain-NAME, the others under their folder's name.
PROG_DIRS := $(patsubst %/,%,$(sort $(dir $(wildcard examples/*/*.c tools/*/*.c bench/*/*.c))))
PROG_NAME  = $(if $(filter examples/%,$1),dtrain-$(notdir $1),$(notdir $1))
PROGS     := $(foreach d,$(PROG_DIRS),$(BIN)/$(call PROG_NAME,$d))

ALL_OBJ := $(LIB_OBJ) $(TESTLIB_OBJ) $(foreach d,$(PROG_DIRS),$(patsubst %.c,$(OUT)/obj/%.o,$(wildcard $d/*.c)))

.PHONY: all lib programs tests test test-slow run deps asan ubsan tsan fuzz fuzz-run bench dnnl-bench \
        golden install install-check clean format format-check help
.DEFAULT_GOAL := all
.SECONDARY:

all: lib programs
lib: $(LIB_A) $(LIB_SO) $(CUDA_PLUGIN)
programs: $(PROGS)
tests: $(TEST_BIN) programs

# Objects depend on the flags they were built with: a flag change rebuilds them.
$(OUT)/flags: FORCE
	@mkdir -p $(OUT)
	@echo '$(CC) $(CFLAGS) $(MPI_CFLAGS) $(NVCC_FLAGS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) $(MPI_CFLAGS) $(NVCC_FLAGS)' > $@
.PHONY: FORCE

$(OUT)/obj/%.o: %.c $(OUT)/flags
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(if $(filter $(MPI_SRC),$<),$(MPI_CFLAGS)) $(if $(filter src/kernels/table.c,$<),$(DNNL_CFLAGS)) $(call KERNEL_FLAGS,$<) -c $< -o $@

# table.c lists oneDNN's fill step only where it is built ($(OUT)/flags-dnnl records that)
$(OUT)/flags-dnnl: FORCE
	@mkdir -p $(OUT)
	@echo '$(DNNL_CFLAGS)' | cmp -s - $@ || echo '$(DNNL_CFLAGS)' > $@
$(OUT)/obj/src/kernels/table.o: $(OUT)/flags-dnnl

define VEC_RULE
$(OUT)/obj/src/kernels/vec/%.$1.o: src/kernels/vec/%.c $(OUT)/flags
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  CC      $$< ($1)")
	$$(Q)$$(CC) $$(CFLAGS) $$(call VEC_FLAGS,$1) -c $$< -o $$@
endef
$(foreach t,$(VEC_TARGETS),$(eval $(call VEC_RULE,$t)))

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,$(SONAME) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MPI_LIBS) $(DNNL_LIBS)

define PROG_RULE
$(BIN)/$(call PROG_NAME,$1): $(patsubst %.c,$(OUT)/obj/%.o,$(wildcard $1/*.c)) $(LIB_A)
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(CC) $$(LDFLAGS) -o $$@ $$^ $$(LDLIBS) $$(MPI_LIBS) $$(DNNL_LIBS)
endef
$(foreach d,$(PROG_DIRS),$(eval $(call PROG_RULE,$d)))

$(OUT)/tests/%: $(OUT)/obj/tests/%.o $(TESTLIB_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MPI_LIBS) $(DNNL_LIBS)

# ---------------------------------------------------------------- running
# DT_EXTRA_PKGS: packages a goal needs beyond the project's own (see bench).
deps:
ifneq ($(NODEPS),1)
	$(Q)DT_EXTRA_PKGS="$(strip $(DT_EXTRA_PKGS))" .ci/deps
endif

# Every test binary, each under a deadline; the runner prints each binary's
# "N passed, N failed" and a total, and fails if any binary failed, crashed or hung.
# BESIDE_TESTS spend their minutes waiting (liveness bounds, forged heartbeats, start-up
# notices), the same under every sanitizer: the runner runs them in a second lane beside
# the others (DT_TEST_BESIDE in tests/run.sh).
BESIDE_TESTS := comm/test_liveness comm/test_liveness_auth comm/test_startup_notice
test: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)DT_TEST_BESIDE="$(BESIDE_TESTS)" tests/run.sh $(TEST_BIN)

# The long matrices (hung peers: 10 trials each of 2 and 4 ranks, shm and tcp, and 10
# link cuts between network namespaces; about 10 minutes), by hand and not under the
# sanitizers: CI's 30 minutes go to the regular suite, whose test_liveness covers each
# case once, and the sanitizers.
# The GPU tests (built with the plugin): test_device --probe says whether a GPU is
# there; without one, or without the plugin, "no GPU" and success.
.PHONY: test-gpu gpu-tests
gpu-tests: $(GPU_TEST_BIN) $(CUDA_PLUGIN)
test-gpu:
ifeq ($(HAVE_CUDA),1)
	$(Q)$(MAKE) --no-print-directory $(GPU_TEST_BIN) $(CUDA_PLUGIN) programs
	$(Q)export DT_CUDA_PLUGIN=$${DT_CUDA_PLUGIN:-$(CURDIR)/$(CUDA_PLUGIN)}; \
	    if $(OUT)/tests/gpu/test_device --probe; then tests/run.sh $(GPU_TEST_BIN); \
	    else echo "no GPU"; fi
else
	@echo "no GPU tests: this dtrain was built without CUDA (make CUDA=1 on a machine with nvcc)"
	@echo "no GPU"
endif

test-slow: deps
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)DT_TEST_SLOW=1 DT_TEST_TIMEOUT=1800 tests/run.sh $(OUT)/tests/comm/test_liveness \
	    $(OUT)/tests/e2e/test_world_invariance

# arm64 on any Debian machine: cross-compiled, run under qemu-user's emulation (no
# binfmt_misc needed: each binary is started by qemu-aarch64, and a training run's workers
# are forked, never exec'd). Correctness only: timings under emulation mean nothing.
# The tests that exec a program (e2e, test_prec's fresh processes) are left out; the
# liveness bounds are raised: emulated ranks run many times slower than native ones.
ARM64_PKGS  := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libdeflate-dev:arm64 \
               zlib1g-dev:arm64
ARM64_TESTS := kernels/test_gemm kernels/test_half kernels/test_rows kernels/test_table \
               golden/test_golden golden/test_graph_golden golden/test_optim_golden \
               grad/test_grad grad/test_grad_ops grad/test_graph_grad
QEMU_ARM64  ?= qemu-aarch64
.PHONY: cross-arm64 test-arm64 arm64-run
cross-arm64 test-arm64: DT_EXTRA_PKGS += $(ARM64_PKGS)
cross-arm64: deps
	$(Q)$(MAKE) --no-print-directory CROSS=arm64 NODEPS=1 all tests
# Builds what it runs (library, programs, those tests), not every test: CI's minutes.
test-arm64: deps
	$(Q)$(MAKE) --no-print-directory CROSS=arm64 NODEPS=1 arm64-run
# One tests/run.sh per folder of tests, as many at once as make -j allows, then the run.
arm64-run: $(addprefix arm64-run-,$(sort $(patsubst %/,%,$(dir $(ARM64_TESTS)))))
	$(Q)echo "dtrain-mnist --num-processes 2 under $(QEMU_ARM64)"
	$(Q)DT_HEARTBEAT_MS=2000 DT_LIVENESS_MS=120000 timeout -k 5 600 $(QEMU_ARM64) \
	    $(BIN)/dtrain-mnist --num-processes 2 --batch-size 16 --limit 64 --threads 1 --no-test
arm64-run-%: programs $(ARM64_TESTS:%=$(OUT)/tests/%)
	$(Q)DT_TEST_RUNNER=$(QEMU_ARM64) tests/run.sh $(filter $(OUT)/tests/$*/%,$(ARM64_TESTS:%=$(OUT)/tests/%))

run: deps
	$(Q)$(MAKE) --no-print-directory programs
	$(BIN)/dtrain-mnist --num-processes 2 --batch-size 64

asan:
	$(Q)$(MAKE) --no-print-directory BUILD=asan NODEPS=1 test
ubsan:
	$(Q)$(MAKE) --no-print-directory BUILD=ubsan NODEPS=1 test
tsan:
	$(Q)$(MAKE) --no-print-directory BUILD=tsan NODEPS=1 tsan-run
.PHONY: tsan-run
tsan-run: $(TSAN_TESTS) # only those: none of them runs a program
	$(Q)TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" DT_TEST_BESIDE="$(BESIDE_TESTS)" \
	    tests/run.sh $(TSAN_TESTS)

# ---------------------------------------------------------------- fuzzing
FUZZ_CC      ?= clang
FUZZ_SRC     := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_BIN     := $(FUZZ_SRC:fuzz/%.c=build/fuzz/%)
# The fuzzers exercise parsers (files, the store's and the wire's messages): they link
# an archive of only the rooms those reach (core, kernels, nn, the parsers of data, ckpt
# and comm), not the trainer, the strategies or the transports, which halves this
# build's minutes. A fuzzer that comes to need another file fails to link, naming the
# symbol: add its file here. oneDNN's provider is left out (table.c is compiled here
# without it).
FUZZ_LIB_SRC := $(filter src/core/% src/kernels/% src/nn/% src/data/hash.c src/data/idx.c \
                         src/data/npy.c src/ckpt/format.c src/comm/auth.c src/comm/notice.c \
                         src/comm/op.c src/comm/sock.c src/comm/store/% src/comm/tcp/wire.c, \
                         $(filter-out $(DNNL_SRC),$(LIB_SRC)))
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=build/fuzz/obj/%.o) $(call VEC_OBJ,build/fuzz/obj)
FUZZ_LIB_A   := build/fuzz/libdtrain-fuzz.a
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -pthread \
                -DDT_FUZZ=1 -fsanitize=fuzzer-no-link,address,undefined $(filter-out -Wcast-qual,$(WARN))
FUZZ_SECONDS ?= 20
# The fuzzers run with DT_ISA=ref, so every kernel they reach is a portable one, built
# with the sanitizers. The per-target kernels never run there and are built without
# them: instrumented, avx512/conv_cl.c alone took clang five minutes.
FUZZ_PLAIN   := $(X86_KERNELS:%=src/kernels/%/%) $(ARM_KERNELS:%=src/kernels/%/%)
FUZZ_PLAIN_CFLAGS := $(filter-out -fsanitize=%,$(FUZZ_CFLAGS))
FUZZ_FLAGS    = $(if $(filter $(FUZZ_PLAIN),$1),$(FUZZ_PLAIN_CFLAGS),$(FUZZ_CFLAGS))

build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZCC  $<")
	$(Q)$(FUZZ_CC) $(call FUZZ_FLAGS,$<) $(call KERNEL_FLAGS,$<) -c $< -o $@

define FUZZ_VEC_RULE
build/fuzz/obj/src/kernels/vec/%.$1.o: src/kernels/vec/%.c
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  FUZZCC  $$< ($1)")
	$$(Q)$$(FUZZ_CC) $$(if $$(filter ref,$1),$$(FUZZ_CFLAGS),$$(FUZZ_PLAIN_CFLAGS)) $$(call VEC_FLAGS,$1) \
	    -c $$< -o $$@
endef
$(foreach t,$(VEC_TARGETS),$(eval $(call FUZZ_VEC_RULE,$t)))

$(FUZZ_LIB_A): $(FUZZ_LIB_OBJ)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

build/fuzz/%: fuzz/%.c $(FUZZ_LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZLD  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)

fuzz: $(FUZZ_BIN)

# Each target for FUZZ_SECONDS from its seed corpus, as many at once as make -j allows;
# a crash fails the run.
FUZZ_RUNS := $(FUZZ_BIN:build/fuzz/%=fuzz-run-%)
.PHONY: $(FUZZ_RUNS)
fuzz-run: $(FUZZ_RUNS)
$(FUZZ_RUNS): fuzz-run-%: build/fuzz/%
	$(Q)name=$*; corpus=fuzz/corpus/$${name#fuzz_}; \
	  mkdir -p build/fuzz/work/$$name; \
	  echo "  FUZZ    $$name for $(FUZZ_SECONDS) s"; \
	  DT_ISA=ref $< -max_total_time=$(FUZZ_SECONDS) -print_final_stats=0 \
	      build/fuzz/work/$$name $$( [ -d $$corpus ] && echo $$corpus ) 2>build/fuzz/$$name.log \
	    || { tail -40 build/fuzz/$$name.log; exit 1; }

# ---------------------------------------------------------------- benchmarks
# The peer's packages too (python3-torch: the PyTorch peer and Gloo), unless NODEPS=1.
bench: DT_EXTRA_PKGS += python3-torch python3-numpy
bench: deps
	$(Q)$(MAKE) --no-print-directory programs
	$(Q)bench/run.sh

# oneDNN's convolutions and inner products against dtrain's kernels (bench/dnnl_conv.c):
# a benchmark, built where oneDNN's headers are (apt-get install libdnnl-dev); the
# bench links oneDNN itself and times dtrain's own kernels against it. OMP_NUM_THREADS=1.
ifeq ($(wildcard /usr/include/oneapi/dnnl/dnnl.h),)
dnnl-bench:
	@echo "dnnl-bench: no oneDNN headers (apt-get install libdnnl-dev): nothing built"
else
dnnl-bench: $(BIN)/dnnl-bench
$(BIN)/dnnl-bench: bench/dnnl_conv.c $(LIB_A) $(OUT)/flags
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -fopenmp $(LDFLAGS) -o $@ $< $(LIB_A) -ldnnl $(LDLIBS) $(DNNL_LIBS)
endif

# ---------------------------------------------------------------- golden fixtures
# PyTorch writes the fixtures tests/golden/test_golden.c reads; they are committed, so
# only a change of an op or of gen.py needs this (and torch: apt-get install python3-torch).
GOLDEN_PYTHON ?= /usr/bin/python3
golden:
	$(Q)$(GOLDEN_PYTHON) tests/golden/gen.py
	$(Q)$(GOLDEN_PYTHON) tests/golden/gen_graph.py

# ---------------------------------------------------------------- install
# Headers, both libraries, every program (examples', tools' and bench's) and dtrain.pc.
# A program linked with `pkg-config --libs dtrain` must run as built: when PREFIX/lib is
# one of the dynamic loader's directories (/lib, /usr/lib, or one ldconfig reads, such
# as /usr/local/lib) ldconfig updates its cache (as root, without DESTDIR; otherwise
# say so); elsewhere the .pc file adds an rpath to PREFIX/lib. `make install-check`
# (.ci/install-check) tries it in a temporary prefix.
LDCONFIG ?= $(or $(shell command -v ldconfig 2>/dev/null),/sbin/ldconfig)
install: lib programs
	install -d $(DESTDIR)$(PREFIX)/include/dtrain $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	           $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/dtrain/*.h $(DESTDIR)$(PREFIX)/include/dtrain/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libdtrain.so
ifneq ($(CUDA_PLUGIN),)
	install -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/$(CUDA_SONAME)
	ln -sf $(CUDA_SONAME) $(DESTDIR)$(PREFIX)/lib/libdtrain_cuda.so
endif
	install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin/
	$(Q)lib=$$(readlink -f "$(PREFIX)/lib" 2>/dev/null || echo "$(PREFIX)/lib"); \
	loader=no; \
	for d in /lib /usr/lib /lib64 /usr/lib64 \
	         $$($(LDCONFIG) -v -N 2>/dev/null | sed -n 's|^\(/[^:]*\):.*|\1|p'); do \
	    [ "$$(readlink -f "$$d" 2>/dev/null || echo "$$d")" = "$$lib" ] && loader=yes; \
	done; \
	if [ $$loader = yes ]; then rpath=""; else rpath='-Wl,-rpath,$${libdir} '; fi; \
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(shell sed -n 's/^#define DT_VERSION_STRING "\(.*\)"/\1/p' include/dtrain/core.h)|g' \
	    -e "s|@RPATH@|$$rpath|g" -e 's|@MPI_LIBS@|$(MPI_LIBS) $(DNNL_LIBS)|g' dtrain.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dtrain.pc; \
	if [ $$loader = no ]; then \
	    echo "dtrain: $(PREFIX)/lib is not in the loader's path: dtrain.pc links with an rpath to it"; \
	elif [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then \
	    $(LDCONFIG) && echo "dtrain: ran ldconfig for $(PREFIX)/lib"; \
	else \
	    echo "dtrain: run ldconfig as root (the loader reads $(PREFIX)/lib from its cache)"; \
	fi

install-check: lib programs
	$(Q).ci/install-check

# ---------------------------------------------------------------- housekeeping
FORMAT_FILES := $(shell find include src tests examples tools bench fuzz -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null)
format:
	clang-format -i $(FORMAT_FILES)
format-check:
	$(Q)clang-format --dry-run --Werror $(FORMAT_FILES)

clean:
	rm -rf build

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

-include $(ALL_OBJ:.o=.d) $(CUDA_OBJ:.o=.d) $(TEST_BIN:$(OUT)/tests/%=$(OUT)/obj/tests/%.d) \
         $(GPU_TEST_BIN:$(OUT)/tests/%=$(OUT)/obj/tests/%.d)
