// flags.c: command lines parsed from tables of flag descriptors (train.h). One table
// names each flag once: its type, target, default, range, help and whether ranks must
// agree on it; the parser, the help text and the start-up agreement all read it.
#include "dtrain/train.h"

#include <limits.h>
#include <string.h>

// Writes v (NULL: none given) to the flag's target. Defaults (is_default) are the
// program's text: parsed over the type's whole range, so a default may lie outside the
// range a user may give (-1 for "automatic", say).
static dt_status set_value(const dt_flag *f, const char *v, const char *shown, bool is_default) {
    char what[96];
    snprintf(what, sizeof what, "--%s", f->name);
    switch (f->type) {
    case DT_FLAG_BOOL:
        *(bool *)f->target = v != NULL;
        return DT_OK;
    case DT_FLAG_LONG: {
        // Bounds beyond a long's range (2^63 as a double) mean the range's end.
        long lo = f->lo <= -9.2e18 ? LONG_MIN : (long)f->lo;
        long hi = f->hi >= 9.2e18 ? LONG_MAX : (long)f->hi;
        if ((f->lo == 0 && f->hi == 0) || is_default)
            lo = LONG_MIN, hi = LONG_MAX;
        long x = 0;
        if (v)
            DT_TRY(dt_parse_long(v, lo, hi, what, &x));
        *(long *)f->target = x;
        return DT_OK;
    }
    case DT_FLAG_DOUBLE: {
        double lo = f->lo, hi = f->hi, x = 0;
        if ((lo == 0 && hi == 0) || is_default)
            lo = -1e308, hi = 1e308;
        if (v)
            DT_TRY(dt_parse_double(v, lo, hi, what, &x));
        *(double *)f->target = x;
        return DT_OK;
    }
    case DT_FLAG_STRING:
        if (v && f->choices && !is_default) {
            size_t      n  = strlen(v);
            const char *p  = f->choices;
            bool        ok = false;
            while (!ok && *p) {
                size_t w = strcspn(p, " ");
                ok       = w == n && n > 0 && strncmp(p, v, n) == 0;
                p += w;
                p += strspn(p, " ");
            }
            if (!ok)
                return dt_fail(DT_ERR_ARG, "%s expects %s, found \"%s\"", what,
                               f->expects ? f->expects : f->choices, shown);
        }
        *(const char **)f->target = v;
        return DT_OK;
    }
    return dt_fail(DT_ERR_INTERNAL, "--%s: unknown flag type %d", f->name, (int)f->type);
}

const dt_flag *dt_flags_find(const dt_flag *const *tables, const char *name) {
    for (int t = 0; tables && tables[t]; t++)
        for (const dt_flag *f = tables[t]; f->name; f++)
            if (strcmp(f->name, name) == 0)
                return f;
    return NULL;
}

dt_status dt_flags_parse(const dt_flag *const *tables, int argc, char **argv, bool *help) {
    *help = false;
    for (int t = 0; tables && tables[t]; t++)
        for (const dt_flag *f = tables[t]; f->name; f++)
            if (f->target)
                DT_TRY(set_value(f, f->type == DT_FLAG_BOOL ? (f->def ? "" : NULL) : f->def,
                                 f->def ? f->def : "", true));
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return dt_fail(DT_ERR_ARG, "unexpected argument \"%s\"", arg);
        if (strcmp(arg, "--help") == 0) {
            *help = true;
            return DT_OK;
        }
        char        name[128];
        const char *eq  = strchr(arg + 2, '=');
        size_t      len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name)
            return dt_fail(DT_ERR_ARG, "unknown option \"%s\"", arg);
        memcpy(name, arg + 2, len);
        name[len]        = '\0';
        const dt_flag *f = dt_flags_find(tables, name);
        if (!f)
            return dt_fail(DT_ERR_ARG, "unknown option \"%s\"", arg);
        const char *v = NULL;
        if (f->type == DT_FLAG_BOOL) {
            if (eq)
                return dt_fail(DT_ERR_ARG, "--%s takes no value, found \"%s\"", name, eq + 1);
            v = "";
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            return dt_fail(DT_ERR_ARG, "--%s expects a value, found none", name);
        }
        if (f->target)
            DT_TRY(set_value(f, v, v, false));
    }
    return DT_OK;
}

void dt_flags_print_help(const dt_flag *const *tables, FILE *out) {
    const char *section = NULL;
    for (int t = 0; tables && tables[t]; t++)
        for (const dt_flag *f = tables[t]; f->name; f++) {
            if (f->section && (!section || strcmp(section, f->section) != 0)) {
                fprintf(out, "%s:\n", f->section);
                section = f->section;
            }
            char head[96];
            snprintf(head, sizeof head, "  --%s%s%s", f->name, f->metavar && *f->metavar ? " " : "",
                     f->metavar ? f->metavar : "");
            const char *h = f->help ? f->help : "";
            if (strlen(head) > 21)
                fprintf(out, "%s\n%22s", head, "");
            else
                fprintf(out, "%-22s", head);
            for (const char *p = h; *p;) {
                size_t n = strcspn(p, "\n");
                fprintf(out, "%.*s\n", (int)n, p);
                p += n;
                if (*p == '\n' && *++p)
                    fprintf(out, "%22s", "");
            }
            if (!*h)
                fputc('\n', out);
        }
}
