// Loss curves as SVG (dtrain/watch.h): nice tick steps; the chart rendered by
// rsvg-convert (librsvg2-bin, in .ci/deps) to PNG, decoded here with zlib, is not
// blank, the training curve's and the validation points' pixels lie inside the axes
// box, the curve falls from left to right as the data does, and an empty chart has
// no curve. Also dtrain-mnist --plot end to end.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/prog.h"
#include "dtrain/watch.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

typedef struct image {
    int            w, h;
    unsigned char *rgb; // w * h * 3
} image;

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

// 8-bit RGB or RGBA, not interlaced (what rsvg-convert writes); alpha over white.
static bool decode_png(const unsigned char *d, size_t n, image *img) {
    static const unsigned char sig[8] = {137, 'P', 'N', 'G', 13, 10, 26, 10};
    if (n < 8 || memcmp(d, sig, 8) != 0)
        return false;
    size_t         pos = 8, zn = 0;
    unsigned char *z = malloc(n);
    int            w = 0, h = 0, ctype = -1;
    while (pos + 12 <= n) {
        uint32_t len = be32(d + pos);
        if (len > n - pos - 12)
            break;
        const unsigned char *type = d + pos + 4, *body = d + pos + 8;
        if (memcmp(type, "IHDR", 4) == 0 && len >= 13) {
            w     = (int)be32(body);
            h     = (int)be32(body + 4);
            ctype = body[9];
            if (body[8] != 8 || body[12] != 0 || (ctype != 2 && ctype != 6)) {
                free(z);
                return false;
            }
        } else if (memcmp(type, "IDAT", 4) == 0) {
            memcpy(z + zn, body, len);
            zn += len;
        } else if (memcmp(type, "IEND", 4) == 0) {
            break;
        }
        pos += 12 + len;
    }
    if (w <= 0 || h <= 0 || w > 20000 || h > 20000) {
        free(z);
        return false;
    }
    int            bpp  = ctype == 6 ? 4 : 3;
    size_t         row  = (size_t)w * (size_t)bpp;
    uLongf         rawn = (uLongf)((row + 1) * (size_t)h);
    unsigned char *raw  = malloc(rawn);
    bool           ok =
        uncompress(raw, &rawn, z, (uLong)zn) == Z_OK && rawn == (uLongf)((row + 1) * (size_t)h);
    free(z);
    unsigned char *px = calloc(row * (size_t)h, 1);
    for (int y = 0; ok && y < h; y++) {
        int                  f   = raw[(size_t)y * (row + 1)];
        const unsigned char *src = raw + (size_t)y * (row + 1) + 1;
        unsigned char       *cur = px + (size_t)y * row, *prev = y ? cur - row : NULL;
        for (size_t i = 0; i < row; i++) {
            int a = i >= (size_t)bpp ? cur[i - (size_t)bpp] : 0, b = prev ? prev[i] : 0;
            int c = prev && i >= (size_t)bpp ? prev[i - (size_t)bpp] : 0, v = src[i];
            switch (f) {
            case 0:
                break;
            case 1:
                v += a;
                break;
            case 2:
                v += b;
                break;
            case 3:
                v += (a + b) / 2;
                break;
            case 4:
                v += paeth(a, b, c);
                break;
            default:
                ok = false;
            }
            cur[i] = (unsigned char)v;
        }
    }
    free(raw);
    if (!ok) {
        free(px);
        return false;
    }
    img->w   = w;
    img->h   = h;
    img->rgb = malloc((size_t)w * (size_t)h * 3);
    for (size_t i = 0; i < (size_t)w * (size_t)h; i++)
        for (int k = 0; k < 3; k++) {
            int v                       = px[i * (size_t)bpp + (size_t)k];
            int al                      = bpp == 4 ? px[i * 4 + 3] : 255;
            img->rgb[i * 3 + (size_t)k] = (unsigned char)((v * al + 255 * (255 - al)) / 255);
        }
    free(px);
    return true;
}

static bool render(const char *svg, const char *png, image *img) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rsvg-convert -f png -o %s %s", png, svg);
    int rc = system(cmd);
    if (!CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)) {
        fprintf(stderr, "     rsvg-convert failed (install librsvg2-bin: .ci/deps)\n");
        return false;
    }
    FILE *f = fopen(png, "rb");
    if (!CHECK(f != NULL))
        return false;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *d  = malloc((size_t)n);
    bool           ok = fread(d, 1, (size_t)n, f) == (size_t)n && decode_png(d, (size_t)n, img);
    fclose(f);
    free(d);
    return CHECK(ok);
}

static bool blueish(const unsigned char *p) { // the training curve, #1f77b4, anti-aliased
    return p[2] > 120 && p[2] > p[0] + 60 && p[1] < p[2];
}
static bool orangeish(const unsigned char *p) { // validation, #ff7f0e
    return p[0] > 200 && p[2] < 110 && p[1] > 60 && p[1] < 200;
}

typedef struct stats {
    long   nonwhite, blue, orange, blue_out, orange_out;
    long   blue_right;    // blue pixels in the rightmost 4% of the box, below the legend
    double left_y, mid_y; // mean row of blue pixels in the box's first quarter, third fifth
} stats;

// The box as plot.c lays it out (margins 78, 24, 44, 58 pixels), 2 pixels of slack.
static stats measure(const image *im) {
    stats  s  = {0};
    int    x0 = 78, x1 = im->w - 24, y0 = 44, y1 = im->h - 58;
    double ly = 0, my = 0;
    long   ln = 0, mn = 0;
    for (int y = 0; y < im->h; y++)
        for (int x = 0; x < im->w; x++) {
            const unsigned char *p = im->rgb + ((size_t)y * (size_t)im->w + (size_t)x) * 3;
            if (p[0] < 245 || p[1] < 245 || p[2] < 245)
                s.nonwhite++;
            bool in = x >= x0 - 2 && x <= x1 + 2 && y >= y0 - 2 && y <= y1 + 2;
            if (blueish(p)) {
                s.blue++;
                s.blue_out += !in;
                if (x < x0 + (x1 - x0) / 4) {
                    ly += y;
                    ln++;
                } else if (x > x0 + (x1 - x0) * 2 / 5 && x < x0 + (x1 - x0) * 3 / 5) {
                    my += y;
                    mn++;
                }
                if (x > x1 - (x1 - x0) / 25 && y > y0 + 70)
                    s.blue_right++;
            }
            if (orangeish(p)) {
                s.orange++;
                s.orange_out += !in;
            }
        }
    s.left_y = ln ? ly / (double)ln : -1;
    s.mid_y  = mn ? my / (double)mn : -1;
    return s;
}

static void test_nice(void) {
    check_current = "nice steps";
    CHECK_NEAR(dt_plot_nice_step(1.0, 5), 0.2, 1e-12);
    CHECK_NEAR(dt_plot_nice_step(10.0, 5), 2.0, 1e-12);
    CHECK_NEAR(dt_plot_nice_step(2.3, 5), 0.5, 1e-12);
    CHECK_NEAR(dt_plot_nice_step(0.07, 5), 0.02, 1e-12);
    CHECK_NEAR(dt_plot_nice_step(190, 8), 25, 1e-9);
    CHECK_NEAR(dt_plot_nice_step(60000, 6), 10000, 1e-6);
    CHECK_NEAR(dt_plot_nice_step(0, 6), 1, 0);
}

static void test_chart(void) {
    check_current = "chart";
    char svg[256], png[256];
    snprintf(svg, sizeof svg, "/tmp/dt_test_plot_%d.svg", (int)getpid());
    snprintf(png, sizeof png, "/tmp/dt_test_plot_%d.png", (int)getpid());
    dt_plot_opts o = dt_plot_opts_default();
    o.title        = "Loss <&> \"test\"";
    dt_plot *p     = NULL;
    CHECK_OK(dt_plot_new(&p, &o));
    if (!p)
        return;
    for (int x = 0; x <= 400; x += 4)
        CHECK_OK(
            dt_plot_add(p, DT_PLOT_TRAIN, x, 2.0 * exp(-x / 60.0) + 0.3 + 0.05 * (x % 8 == 0)));
    for (int x = 100; x <= 400; x += 100)
        CHECK_OK(dt_plot_add(p, DT_PLOT_VAL, x, 2.0 * exp(-x / 60.0) + 0.4));
    CHECK_ERR(dt_plot_add(p, DT_PLOT_TRAIN, 1, NAN), DT_ERR_ARG, "finite");
    CHECK_ERR(dt_plot_add(p, (dt_plot_series)7, 1, 1), DT_ERR_ARG, "DT_PLOT_TRAIN");
    CHECK_OK(dt_plot_write_svg(p, svg));
    dt_plot_free(p);

    // Tick labels at nice numbers, escaped title.
    FILE *f   = fopen(svg, "r");
    char *txt = calloc(1, 1 << 20);
    if (f) {
        if (fread(txt, 1, (1 << 20) - 1, f) == 0)
            txt[0] = 0;
        fclose(f);
    }
    CHECK(strstr(txt, ">0.0</text>") != NULL); // y: 0.3..2.35 in steps of 0.5
    CHECK(strstr(txt, ">2.5</text>") != NULL);
    CHECK(strstr(txt, ">400</text>") != NULL); // x: 0..400 in steps of 50
    CHECK(strstr(txt, ">50</text>") != NULL);
    CHECK(strstr(txt, "Loss &lt;&amp;&gt; &quot;test&quot;") != NULL);
    CHECK(strstr(txt, ">step</text>") != NULL && strstr(txt, ">loss</text>") != NULL);
    CHECK(strstr(txt, ">train</text>") != NULL && strstr(txt, ">validation</text>") != NULL);
    free(txt);

    image im = {0};
    if (render(svg, png, &im)) {
        CHECK_EQ(im.w, 720);
        CHECK_EQ(im.h, 420);
        stats s = measure(&im);
        CHECK(s.nonwhite > im.w * im.h / 100); // not blank
        CHECK(s.blue > 400);                   // the curve is drawn
        CHECK_EQ(s.blue_out, 0);               // and inside the axes
        CHECK(s.orange > 60);
        CHECK_EQ(s.orange_out, 0);
        CHECK(s.blue_right > 0);            // it reaches the right edge
        CHECK(s.left_y > 0 && s.mid_y > 0); // falling loss: higher on the left (smaller row)
        CHECK(s.left_y + 40 < s.mid_y);
        free(im.rgb);
    }

    // No points: axes and legend only, no curve.
    CHECK_OK(dt_plot_new(&p, NULL));
    CHECK_OK(dt_plot_write_svg(p, svg));
    dt_plot_free(p);
    if (render(svg, png, &im)) {
        stats s = measure(&im);
        CHECK(s.nonwhite > 1000); // axes, ticks, labels
        CHECK(s.blue < 120);      // the legend's sample line only
        CHECK_EQ(s.blue_right, 0);
        free(im.rgb);
    }
    CHECK_ERR(dt_plot_new(&p, &(dt_plot_opts){.width = 10, .height = 10}), DT_ERR_ARG, "size");
    unlink(svg);
    unlink(png);
}

static void test_mnist(void) {
    check_current = "dtrain-mnist --plot";
    char bin[512];
    if (!test_program_path("dtrain-mnist", bin, sizeof bin)) {
        fprintf(stderr, "skipping: no dtrain-mnist built\n");
        return;
    }
    char svg[256], png[256], cmd[1200];
    snprintf(svg, sizeof svg, "/tmp/dt_test_plot_mnist_%d.svg", (int)getpid());
    snprintf(png, sizeof png, "/tmp/dt_test_plot_mnist_%d.png", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "%s --limit 1024 --batch-size 32 --threads 1 --num-processes 2 --epochs 2 "
             "--log-every 2 --plot %s > /dev/null",
             bin, svg);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    image im = {0};
    if (render(svg, png, &im)) {
        stats s = measure(&im);
        CHECK(s.blue > 400);
        CHECK_EQ(s.blue_out, 0);
        CHECK(s.orange > 60); // two test-loss points (after epochs 1 and 2)
        CHECK_EQ(s.orange_out, 0);
        free(im.rgb);
    }
    unlink(svg);
    unlink(png);
}

int main(void) {
#ifdef DT_SANITIZE // evaluations on 1,000 test images: no check here depends on the split's size
    CHECK(tl_fmnist_short_test(1000));
#endif
    test_nice();
    test_chart();
    test_mnist();
    return check_summary();
}
