// ckpt_impl.h: the checkpoint file format shared by format.c (bytes: write, parse,
// decode) and ckpt.c (directories, collective save and load). Layout in
// docs/checkpoint-format.md.
#ifndef DTRAIN_CKPT_IMPL_H
#define DTRAIN_CKPT_IMPL_H

#include "dtrain/ckpt.h"

#include <stdio.h>

// Floats are written in host order; the format says little-endian.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint files store little-endian floats; add byte swapping for this host");

#define CK_MAGIC                                                                                   \
    "\x89"                                                                                         \
    "DTCKPT\n"
#define CK_HEADER_SIZE  64
#define CK_SECHDR_SIZE  24
#define CK_MAX_SECTIONS 64

// File kinds (header field "kind").
enum {
    CK_KIND_STATE  = 1, // state.dtck: parameters, optimizer, user key/values
    CK_KIND_RANK   = 2, // rank-<R>.dtck: sampler, RNG states
    CK_KIND_MARKER = 3, // complete.dtck: manifest
    CK_KIND_MODEL  = 4, // a model file (--save-model): parameters only
};

// Section tags: four ASCII letters read as a little-endian u32.
#define CK_TAG(a, b, c, d)                                                                         \
    ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define CK_TAG_PTAB CK_TAG('P', 'T', 'A', 'B') // parameter table
#define CK_TAG_PARM CK_TAG('P', 'A', 'R', 'M') // flat parameters
#define CK_TAG_BTAB CK_TAG('B', 'T', 'A', 'B') // buffer table (version 2)
#define CK_TAG_BUFS CK_TAG('B', 'U', 'F', 'S') // flat non-trainable buffers (version 2)
#define CK_TAG_OPTM CK_TAG('O', 'P', 'T', 'M') // optimizer state
#define CK_TAG_SMPL CK_TAG('S', 'M', 'P', 'L') // sampler epoch and position
#define CK_TAG_RNGS CK_TAG('R', 'N', 'G', 'S') // named RNG states
#define CK_TAG_KVAL CK_TAG('K', 'V', 'A', 'L') // user key/values
#define CK_TAG_MANI CK_TAG('M', 'A', 'N', 'I') // manifest (marker files)

#define CK_STATE_FILE    "state.dtck"
#define CK_MARKER_FILE   "complete.dtck"
#define CK_RANK_FILE_FMT "rank-%05d.dtck" // of rank R

// ------------------------------------------------------------------------- writing

// A growable byte buffer; a failed allocation sets `oom` and later puts do nothing.
typedef struct ck_buf {
    uint8_t *p;
    size_t   len, cap;
    bool     oom;
} ck_buf;

void dt_ckpt_buf_u32(ck_buf *b, uint32_t v);
void dt_ckpt_buf_u64(ck_buf *b, uint64_t v);
void dt_ckpt_buf_bytes(ck_buf *b, const void *p, size_t n);
void dt_ckpt_buf_str(ck_buf *b, const char *s); // u32 length, then the bytes
void dt_ckpt_buf_free(ck_buf *b);

// One section to write: `head` (owned small bytes) then `data` (borrowed bulk, may be
// NULL).
typedef struct ck_section {
    uint32_t    tag;
    ck_buf      head;
    const void *data;
    size_t      data_len;
} ck_section;

typedef struct ck_header {
    uint32_t kind;
    int64_t  step;
    uint32_t world, rank;
} ck_header;

// Writes a whole file atomically (tmp, fsync, rename, fsync directory). Returns its
// size and header CRC (the fingerprint the manifest records). DT_ERR_IO naming the
// path and the step that failed.
dt_status dt_ckpt_write_file(const char *path, const ck_header *h, const ck_section *secs,
                             int nsecs, uint64_t *size_out, uint32_t *crc_out);
// fsync of a directory (after creating or removing entries in it).
dt_status dt_ckpt_fsync_dir(const char *dir);

// ------------------------------------------------------------------------- reading

typedef struct ck_sec {
    uint32_t       tag;
    const uint8_t *p;
    uint64_t       len;
} ck_sec;

typedef struct ck_file {
    const char *name;    // for messages
    uint32_t    version; // DT_CKPT_VERSION_MIN..DT_CKPT_VERSION
    uint32_t    kind, world, rank, nsec;
    int64_t     step;
    uint64_t    size;
    uint32_t    header_crc;
    ck_sec      sec[CK_MAX_SECTIONS];
} ck_file;

// Checks magic, version, header, sizes and every checksum. DT_ERR_FORMAT.
dt_status dt_ckpt_parse(const void *buf, size_t n, const char *name, ck_file *f);

// A checkpoint file being read: header first, so that a file that is not a checkpoint,
// or not the one its marker lists, is refused after 64 bytes instead of being read (and
// allocated) whole.
typedef struct ck_reader {
    FILE       *fp;
    const char *path;
    uint64_t    size; // the file's real size
    uint8_t     hdr[CK_HEADER_SIZE];
} ck_reader;

// Opens path (a regular file only: a FIFO is refused, never waited on) and reads and
// checks its header against the file's size; *f gets the header's fields (no sections
// yet). DT_ERR_IO or DT_ERR_FORMAT; nothing is left open on failure.
dt_status dt_ckpt_open(const char *path, ck_reader *r, ck_file *f);
// Reads the rest into an owned buffer (dt_free) and parses the whole file into *f
// (dt_ckpt_parse); closes r, also on failure.
dt_status dt_ckpt_read_body(ck_reader *r, uint8_t **buf, ck_file *f);
void      dt_ckpt_close(ck_reader *r);
// Both: the whole file read and parsed, its header checked first.
dt_status dt_ckpt_read(const char *path, uint8_t **buf, ck_file *f);
// The section with `tag`, or NULL.
const ck_sec *dt_ckpt_find(const ck_file *f, uint32_t tag);
// The section with `tag`, or DT_ERR_FORMAT naming the file kind and the section.
dt_status dt_ckpt_need(const ck_file *f, uint32_t tag, const ck_sec **out);
// Checks the kind field: DT_ERR_FORMAT "expected a state file, found a rank file".
dt_status   dt_ckpt_expect_kind(const ck_file *f, uint32_t kind, uint32_t also);
const char *dt_ckpt_kind_name(uint32_t kind);

// Decoded sections. Pointers point into the file image.
typedef struct ck_parm {
    uint64_t       count;
    const uint8_t *floats; // count floats, unaligned
} ck_parm;

typedef struct ck_optm {
    char           name[DT_CKPT_NAME_MAX + 1];
    int64_t        steps;
    uint64_t       num_params, nfloats;
    const uint8_t *floats;
} ck_optm;

typedef struct ck_smpl {
    uint64_t epoch, position, num_samples, total_size, dataset_size;
} ck_smpl;

dt_status dt_ckpt_decode_parm(const ck_file *f, const ck_sec *s, ck_parm *out);
dt_status dt_ckpt_decode_optm(const ck_file *f, const ck_sec *s, ck_optm *out);
dt_status dt_ckpt_decode_smpl(const ck_file *f, const ck_sec *s, ck_smpl *out);
// Validates a tensor table (PTAB, or BTAB when `buffers`) against the float count and,
// when p is not NULL, compares it with p's parameter (or buffer) table
// (DT_ERR_MISMATCH naming the first difference). Version 1 entries have no flags.
dt_status dt_ckpt_check_ptab(const ck_file *f, const ck_sec *s, uint64_t nfloats,
                             const dt_params *p, bool buffers);
// Validates every entry; with `name`, copies that entry's state into *out and sets
// *found.
dt_status dt_ckpt_check_rngs(const ck_file *f, const ck_sec *s, const char *name, dt_rng *out,
                             bool *found);
// Validates; with `out`, returns an owned copy (one block: dt_free(*out)).
dt_status dt_ckpt_decode_kval(const ck_file *f, const ck_sec *s, dt_ckpt_kv **out, int *n);
// Validates the manifest; with `name`, returns that file's size and header CRC.
dt_status dt_ckpt_check_mani(const ck_file *f, const ck_sec *s, const char *name, uint64_t *size,
                             uint32_t *crc, bool *found);
// Manifest entry i (for verifying a whole directory); false past the end. The name
// is copied into name (DT_CKPT_NAME_MAX + 1 bytes). Call after dt_ckpt_check_mani.
bool dt_ckpt_mani_entry(const ck_sec *s, uint32_t i, char *name, uint64_t *size, uint32_t *crc);

// ------------------------------------------------------- directories (ckpt.c)

#define CK_PATH_CAP 4096

// "<dir>/<name>" into out (CK_PATH_CAP bytes); DT_ERR_ARG when too long.
dt_status dt_ckpt_join(char *out, const char *dir, const char *name);
bool      dt_ckpt_is_file(const char *path);
// The marker of checkpoint cdir, read and checked whole (step >= 0: it must be that
// step); path (CK_PATH_CAP) gets its path, *buf the owned image.
dt_status dt_ckpt_read_marker(const char *cdir, int64_t step, char *path, uint8_t **buf,
                              ck_file *f);
// One file of checkpoint cdir, checked whole and against the marker mf (size, header
// CRC, step, world) and its kind.
dt_status dt_ckpt_read_member(const char *cdir, const char *name, uint32_t kind, const ck_file *mf,
                              int64_t step, char *path, uint8_t **buf, ck_file *f);

// ------------------------------------------------ parameters and buffers (tables.c)

#define CK_MODEL_SECTIONS 4 // PTAB PARM BTAB BUFS

// p's tables and floats as sections 0..3 of secs (free with dt_ckpt_free_sections).
void dt_ckpt_model_sections(ck_section *secs, dt_params *p);
void dt_ckpt_free_sections(ck_section *secs, int n);
// The parameters and buffers of a state or model file checked against p's tables
// (a version-1 file has no buffers); parm and bufs point into the file image.
dt_status dt_ckpt_check_params(const ck_file *f, const dt_params *p, ck_parm *parm, ck_parm *bufs);
// Copies them into p (after dt_ckpt_check_params).
void dt_ckpt_copy_params(dt_params *p, const ck_parm *parm, const ck_parm *bufs);

// Every check dt_ckpt_verify_bytes makes, on a parsed file.
dt_status dt_ckpt_check_file(const ck_file *f);

// A sharded optimizer's whole state (shard.c): COLLECTIVE over pg; rank 0's *full (owned)
// gets every block at the whole table's size (*nfull floats), NULL elsewhere.
dt_status dt_ckpt_gather_optim(dt_pg *pg, dt_optim *o, float **full, size_t *nfull);
// This rank's pieces of the whole state `full` (floats, unaligned) into the sharded
// optimizer's state.
void dt_ckpt_scatter_optim(dt_optim *o, const uint8_t *full);

#endif // DTRAIN_CKPT_IMPL_H
