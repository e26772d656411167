/* Classifies MNIST's test set with a classifier exported by tapejit (no LLVM, no Rust, no
 * Python here: the object file and libm).
 *
 *   cargo run --release --example mnist -- --data DIR --export target/export/mnist.o
 *   cc -O2 -I target/export examples/c/mnist.c target/export/mnist.o -lm -o target/export/mnist
 *   target/export/mnist DIR
 *
 * DIR holds MNIST's test files, t10k-images and t10k-labels, in IDX form, raw or gzipped
 * (read through `gzip -dc`), named with a dot or a dash before idx. The inputs are built as
 * the trainer builds them (pixels / 255, then the label one-hot), so the accuracy is the
 * trainer's to the digit, and the mean loss its test loss. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mnist.h"

/* The IDX file `name` in `dir`, whole, in one of its four spellings; NULL if none opens. */
static unsigned char *read_idx(const char *dir, const char *stem, const char *kind, size_t *len) {
    static const char *forms[] = {"%s/%s-%s", "%s/%s.%s", "%s/%s-%s.gz", "%s/%s.%s.gz"};
    for (int f = 0; f < 4; f++) {
        char path[4096];
        snprintf(path, sizeof path, forms[f], dir, stem, kind);
        FILE *probe = fopen(path, "rb");
        if (!probe) continue;
        FILE *in = probe;
        int gz = f >= 2;
        if (gz) {
            fclose(probe);
            char command[4200];
            snprintf(command, sizeof command, "gzip -dc '%s'", path);
            in = popen(command, "r");
            if (!in) return NULL;
        }
        size_t cap = 1 << 20, n = 0, got;
        unsigned char *buf = malloc(cap);
        while (buf && (got = fread(buf + n, 1, cap - n, in)) > 0) {
            n += got;
            if (n == cap) buf = realloc(buf, cap *= 2);
        }
        if (gz) pclose(in); else fclose(in);
        *len = n;
        return buf;
    }
    return NULL;
}

static uint32_t big_endian(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "data/mnist";
    size_t images_len, labels_len;
    unsigned char *images = read_idx(dir, "t10k-images", "idx3-ubyte", &images_len);
    unsigned char *labels = read_idx(dir, "t10k-labels", "idx1-ubyte", &labels_len);
    if (!images || !labels || images_len < 16 || labels_len < 8) {
        fprintf(stderr, "cannot read MNIST's test files in %s\n", dir);
        return 1;
    }
    uint32_t n = big_endian(images + 4), pixels = big_endian(images + 8) * big_endian(images + 12);
    if (pixels + 10 != MNIST_NUM_INPUTS || MNIST_NUM_OUTPUTS != 10 || big_endian(labels + 4) != n ||
        images_len < 16 + (size_t)n * pixels || labels_len < 8 + (size_t)n) {
        fprintf(stderr, "the test files do not fit the exported classifier\n");
        return 1;
    }
    double *workspace = aligned_alloc(64, (MNIST_WORKSPACE_DOUBLES * sizeof(double) + 63) / 64 * 64);
    double inputs[MNIST_NUM_INPUTS], outputs[MNIST_NUM_OUTPUTS], loss = 0;
    mnist_init(workspace);
    /* Each byte's quotient, divided once: the trainer's numbers, without 784 divisions per
     * image. */
    double scaled[256];
    for (int b = 0; b < 256; b++) scaled[b] = b / 255.0;
    uint32_t correct = 0;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (uint32_t i = 0; i < n; i++) {
        const unsigned char *image = images + 16 + (size_t)i * pixels;
        int label = labels[8 + i];
        for (uint32_t p = 0; p < pixels; p++) inputs[p] = scaled[image[p]];
        for (int k = 0; k < 10; k++) inputs[pixels + k] = k == label ? 1.0 : 0.0;
        loss += mnist_forward(workspace, inputs, outputs);
        int guess = 0;
        for (int k = 1; k < 10; k++)
            if (outputs[k] > outputs[guess]) guess = k;
        correct += guess == label;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double secs = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) * 1e-9;
    printf("test accuracy %.2f%% (%u of %u), mean test loss %.4f, %.2f us/sample\n",
           100.0 * correct / n, correct, n, loss / n, secs * 1e6 / n);
    free(workspace);
    free(images);
    free(labels);
    return 0;
}
