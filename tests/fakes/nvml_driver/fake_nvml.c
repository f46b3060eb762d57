/*
 * A fake NVIDIA driver library: the NVML entry points rbroker's gateway reaches through the
 * real pynvml (nvidia-ml-py), with the signatures and struct layouts of NVIDIA's nvml.h as
 * pynvml declares them. Built as libnvidia-ml.so.1 on Linux (cc) and as nvml.dll for Windows
 * (x86_64-w64-mingw32-gcc); tests/fakes/nvml_driver.py builds it and writes its state.
 *
 * State: the file named by RBROKER_FAKE_NVML_STATE, read again on every call (tests replace
 * it atomically to change the driver mid-run). Without the variable, or with a file that
 * cannot be read, nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED, like a library whose kernel
 * module is missing. The format, one item per line (`#` lines ignored):
 *
 *   init_error CODE              what nvmlInit returns (0: success)
 *   driver_version TEXT
 *   process_struct v2|v1|wide    the record size this library writes for the _v2/_v3 process
 *                                lists: v2 (24 bytes, what pynvml reads), v1 (16, an older
 *                                library), wide (32, a newer one): the last two give garbage
 *   count_error CODE             what nvmlDeviceGetCount returns
 *   gpu UUID                     starts a GPU (whole GPU, or a MIG slice when under `mig`)
 *   name TEXT
 *   total_mib N / used_mib N     used: the device's used memory, reserved included (v1 sense)
 *   reserved_mib N
 *   memory CODE                  what the memory queries return (3: unified memory, none)
 *   memory_v2_error CODE         what nvmlDeviceGetMemoryInfo_v2 alone returns (25: a library
 *                                that knows another version of the struct; 13: none)
 *   error CODE                   what every memory and process query of this GPU returns
 *   process_list_error CODE      what the process lists return
 *   delay_ms N                   each memory or process query sleeps this long (re-reading the
 *                                state every 50 ms, so a rewrite ends a hang)
 *   per_process_memory 0|1       0: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (WDDM)
 *   utilization_error CODE       what nvmlDeviceGetProcessUtilization returns (3: a GPU
 *                                without per-process utilization; 4: no permission)
 *   process PID MIB|-1 compute|graphics [SM]
 *                                SM: the process's SM utilization in percent (0..100, default
 *                                0); nvmlDeviceGetProcessUtilization answers one sample per
 *                                process above 0, stamped with the time of the call
 *   mig N                        this GPU is in MIG mode with N slice positions; the `slice`
 *                                GPUs that follow (until the next `gpu`) are its slices
 *   slice UUID                   starts a MIG slice of the last `gpu` (same keys as a GPU)
 *
 * Build variants: -DRBROKER_OLD_DRIVER leaves out what a driver before R510 lacks (the _v3
 * process lists and nvmlDeviceGetMemoryInfo_v2), so pynvml's lookup of them fails with
 * NVML_ERROR_FUNCTION_NOT_FOUND, as on such a driver; it also leaves out
 * nvmlDeviceGetProcessUtilization, standing for a library without that call (real drivers
 * have had it long before R510), so the old driver shows per-process utilization unknown.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <windows.h>
#define EXPORT __declspec(dllexport)
static void sleep_ms(unsigned ms) { Sleep(ms); }
static SRWLOCK issue_lock = SRWLOCK_INIT;
static void lock(void) { AcquireSRWLockExclusive(&issue_lock); }
static void unlock(void) { ReleaseSRWLockExclusive(&issue_lock); }
#else
#include <pthread.h>
#include <time.h>
static pthread_mutex_t issue_lock = PTHREAD_MUTEX_INITIALIZER;
static void lock(void) { pthread_mutex_lock(&issue_lock); }
static void unlock(void) { pthread_mutex_unlock(&issue_lock); }
#define EXPORT __attribute__((visibility("default")))
static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}
#endif

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MIB 1048576ULL
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define MAX_GPUS 16
#define MAX_SLICES 8
#define MAX_PROCS 256
#define NAME_LEN 96

/* nvml.h: nvmlMemory_t, nvmlMemory_v2_t (version 0x02000028: size 40, version 2),
   nvmlProcessInfo_v1_t (16 bytes), nvmlProcessInfo_v2_t = nvmlProcessInfo_t (24), nvmlPciInfo_t */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
#define NVML_MEMORY_V2 0x02000028u

/* nvml.h: nvmlProcessUtilizationSample_t (pynvml's c_nvmlProcessUtilizationSample_t; 32 bytes:
   timeStamp is the CPU time of the sample in microseconds, the utilizations percent) */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct { unsigned int pid; long long mib; int graphics, sm_util; } proc_t;
typedef struct {
    char uuid[NAME_LEN], name[NAME_LEN];
    long long total_mib, used_mib, reserved_mib;
    int memory, memory_v2_error, error, process_list_error, delay_ms, per_process_memory, mig;
    int utilization_error;
    int nprocs;
    proc_t procs[MAX_PROCS];
} gpu_t;
typedef struct {
    int ok, init_error, count_error, stride;
    char driver_version[80];
    int ngpus;
    gpu_t gpus[MAX_GPUS];
    int nslices[MAX_GPUS];
    gpu_t slices[MAX_GPUS][MAX_SLICES];
} state_t;

static void copy_text_(char *dst, size_t size, const char *src) {
    strncpy(dst, src, size - 1);
    dst[size - 1] = 0;
}
#define copy_text copy_text_

/* A handle is the address of handles[k], k the position of its UUID in `issued`: like a real
   driver's, a handle stays the same GPU's for the library's life (whatever the order of the
   GPUs in the state), and a handle whose GPU left the state answers NVML_ERROR_GPU_IS_LOST. */
#define MAX_HANDLES 256
static char handles[MAX_HANDLES];
static char issued[MAX_HANDLES][NAME_LEN];
static int nissued;
static volatile int initialised;

static void *handle_for(const char *uuid) {
    void *out = NULL;
    lock();
    for (int k = 0; k < nissued && !out; k++)
        if (!strcmp(issued[k], uuid)) out = &handles[k];
    if (!out && nissued < MAX_HANDLES) {
        copy_text_(issued[nissued], NAME_LEN, uuid);
        out = &handles[nissued++];
    }
    unlock();
    return out;
}

static void chomp(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
}


static void gpu_defaults(gpu_t *g, const char *uuid) {
    memset(g, 0, sizeof *g);
    copy_text(g->uuid, sizeof g->uuid, uuid);
    copy_text(g->name, sizeof g->name, "Fake NVIDIA GPU");
    g->total_mib = 24576;
    g->per_process_memory = 1;
    g->mig = -1;
}

/* Parse the state file into *st (heap: it is large). st->ok is 0 when there is none. */
static void load(state_t *st) {
    memset(st, 0, sizeof *st);
    st->stride = (int)sizeof(nvmlProcessInfo_v2_t);
    copy_text(st->driver_version, sizeof st->driver_version, "550.54.14");
#ifdef _WIN32
    /* the process environment, not this C runtime's copy (Python sets the former) */
    char path[1024];
    DWORD got = GetEnvironmentVariableA("RBROKER_FAKE_NVML_STATE", path, sizeof path);
    if (got == 0 || got >= sizeof path) return;
#else
    const char *path = getenv("RBROKER_FAKE_NVML_STATE");
    if (!path || !*path) return;
#endif
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    gpu_t *g = NULL;
    while (fgets(line, sizeof line, f)) {
        chomp(line);
        char *sp = strchr(line, ' ');
        const char *value = sp ? sp + 1 : "";
        if (sp) *sp = 0;
        const char *key = line;
        long long n = atoll(value);
        if (!*key || *key == '#') continue;
        if (!strcmp(key, "init_error")) st->init_error = (int)n;
        else if (!strcmp(key, "count_error")) st->count_error = (int)n;
        else if (!strcmp(key, "driver_version"))
            copy_text(st->driver_version, sizeof st->driver_version, value);
        else if (!strcmp(key, "process_struct"))
            st->stride = !strcmp(value, "v1")     ? (int)sizeof(nvmlProcessInfo_v1_t)
                         : !strcmp(value, "wide") ? 32
                                                  : (int)sizeof(nvmlProcessInfo_v2_t);
        else if (!strcmp(key, "gpu")) {
            if (st->ngpus == MAX_GPUS) { g = NULL; continue; }
            g = &st->gpus[st->ngpus++];
            gpu_defaults(g, value);
        } else if (!strcmp(key, "slice")) {
            int i = st->ngpus - 1;
            if (i < 0 || st->nslices[i] == MAX_SLICES) { g = NULL; continue; }
            g = &st->slices[i][st->nslices[i]++];
            gpu_defaults(g, value);
        } else if (!g) continue;
        else if (!strcmp(key, "name")) copy_text(g->name, sizeof g->name, value);
        else if (!strcmp(key, "total_mib")) g->total_mib = n;
        else if (!strcmp(key, "used_mib")) g->used_mib = n;
        else if (!strcmp(key, "reserved_mib")) g->reserved_mib = n;
        else if (!strcmp(key, "memory")) g->memory = (int)n;
        else if (!strcmp(key, "memory_v2_error")) g->memory_v2_error = (int)n;
        else if (!strcmp(key, "error")) g->error = (int)n;
        else if (!strcmp(key, "process_list_error")) g->process_list_error = (int)n;
        else if (!strcmp(key, "delay_ms")) g->delay_ms = (int)n;
        else if (!strcmp(key, "per_process_memory")) g->per_process_memory = (int)n;
        else if (!strcmp(key, "utilization_error")) g->utilization_error = (int)n;
        else if (!strcmp(key, "mig")) g->mig = (int)n;
        else if (!strcmp(key, "process") && g->nprocs < MAX_PROCS) {
            proc_t *p = &g->procs[g->nprocs++];
            char kind[16] = "compute";
            unsigned int pid = 0;
            long long mib = -1;
            int sm_util = 0;
            sscanf(value, "%u %lld %15s %d", &pid, &mib, kind, &sm_util);
            p->pid = pid;
            p->mib = mib;
            p->graphics = !strcmp(kind, "graphics");
            p->sm_util = sm_util < 0 ? 0 : sm_util > 100 ? 100 : sm_util;
        }
    }
    fclose(f);
    st->ok = 1;
}

static state_t *state_new(void) {
    state_t *st = (state_t *)malloc(sizeof(state_t));
    if (st) load(st);
    return st;
}

/* Where a handle's GPU is in this state: whole GPU `index`, or slice `slot` of it. */
typedef struct { const gpu_t *gpu; int index, slot; } where_t;

static where_t lookup(const state_t *st, const void *handle) {
    where_t w = {NULL, -1, -1};
    const char *h = (const char *)handle;
    if (h < handles || h >= handles + MAX_HANDLES) return w;
    char uuid[NAME_LEN];
    lock();
    copy_text(uuid, sizeof uuid, issued[h - handles]);
    unlock();
    for (int i = 0; i < st->ngpus; i++) {
        if (!strcmp(st->gpus[i].uuid, uuid)) {
            w.gpu = &st->gpus[i];
            w.index = i;
            return w;
        }
        for (int s = 0; s < st->nslices[i] && st->gpus[i].mig > 0; s++)
            if (!strcmp(st->slices[i][s].uuid, uuid)) {
                w.gpu = &st->slices[i][s];
                w.index = i;
                w.slot = s;
                return w;
            }
    }
    return w;
}

/* Common start of a per-GPU query: initialised, the GPU present, its delay and its error. */
static nvmlReturn_t enter_at(state_t *st, const void *handle, where_t *out, int slow) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!st) return NVML_ERROR_UNKNOWN;
    if (!handle) return NVML_ERROR_INVALID_ARGUMENT;
    where_t w = lookup(st, handle);
    if (!w.gpu) return NVML_ERROR_GPU_IS_LOST;
    if (slow && w.gpu->delay_ms > 0) {
        int waited = 0;
        while (w.gpu && waited < w.gpu->delay_ms) {
            sleep_ms(50);
            waited += 50;
            load(st);
            w = lookup(st, handle);
        }
        if (!w.gpu) return NVML_ERROR_GPU_IS_LOST;
    }
    if (slow && w.gpu->error) return w.gpu->error;
    *out = w;
    return NVML_SUCCESS;
}

static nvmlReturn_t enter(state_t **pst, const void *handle, const gpu_t **out, int slow) {
    where_t w;
    nvmlReturn_t ret = enter_at(*pst, handle, &w, slow);
    if (ret == NVML_SUCCESS) *out = w.gpu;
    return ret;
}

#define WITH_STATE(expr)                      \
    do {                                      \
        state_t *st = state_new();            \
        nvmlReturn_t ret_ = (expr);           \
        free(st);                             \
        return ret_;                          \
    } while (0)

/* -- init -------------------------------------------------------------------------------- */
static nvmlReturn_t do_init(state_t *st) {
    if (!st || !st->ok) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st->init_error) return st->init_error;
    initialised++;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; WITH_STATE(do_init(st)); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { WITH_STATE(do_init(st)); }
EXPORT nvmlReturn_t nvmlInit(void) { WITH_STATE(do_init(st)); }
EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t text_out(const char *text, char *buf, unsigned int size) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t driver_version(state_t *st, char *buf, unsigned int size) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!st) return NVML_ERROR_UNKNOWN;
    return text_out(st->driver_version, buf, size);
}
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int size) {
    WITH_STATE(driver_version(st, buf, size));
}
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned int size) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return text_out("12.550.54.14", buf, size);
}

/* -- devices ----------------------------------------------------------------------------- */
static nvmlReturn_t count(state_t *st, unsigned int *out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!st || !out) return NVML_ERROR_INVALID_ARGUMENT;
    if (st->count_error) return st->count_error;
    *out = (unsigned int)st->ngpus;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *out) { WITH_STATE(count(st, out)); }
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *out) { WITH_STATE(count(st, out)); }

static nvmlReturn_t by_index(state_t *st, unsigned int index, void **out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!st || !out || index >= (unsigned int)st->ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *out = handle_for(st->gpus[index].uuid);
    return *out ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **out) {
    WITH_STATE(by_index(st, i, out));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, void **out) {
    WITH_STATE(by_index(st, i, out));
}

static nvmlReturn_t by_uuid(state_t *st, const char *uuid, void **out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!st || !uuid || !out) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < st->ngpus; i++) {
        int found = !strcmp(st->gpus[i].uuid, uuid);
        for (int s = 0; s < st->nslices[i] && st->gpus[i].mig > 0; s++)
            found = found || !strcmp(st->slices[i][s].uuid, uuid);
        if (found) {
            *out = handle_for(uuid);
            return *out ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **out) {
    WITH_STATE(by_uuid(st, uuid, out));
}

static nvmlReturn_t uuid_of(state_t *st, void *h, char *buf, unsigned int size, int name) {
    const gpu_t *g = NULL;
    nvmlReturn_t ret = enter(&st, h, &g, 0);
    if (ret) return ret;
    return text_out(name ? g->name : g->uuid, buf, size);
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(void *h, char *buf, unsigned int size) {
    WITH_STATE(uuid_of(st, h, buf, size, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetName(void *h, char *buf, unsigned int size) {
    WITH_STATE(uuid_of(st, h, buf, size, 1));
}

static nvmlReturn_t index_of(state_t *st, void *h, unsigned int *out, int *slot) {
    where_t w;
    nvmlReturn_t ret = enter_at(st, h, &w, 0);
    if (ret) return ret;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)w.index;
    if (slot) *slot = w.slot;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(void *h, unsigned int *out) {
    WITH_STATE(index_of(st, h, out, NULL));
}

/* GPU number i sits at PCI bus i + 1, as in the Python fake. */
static nvmlReturn_t pci(state_t *st, void *h, nvmlPciInfo_t *out) {
    unsigned int index = 0;
    int slot = -1;
    nvmlReturn_t ret = index_of(st, h, &index, &slot);
    if (ret) return ret;
    if (slot >= 0) return NVML_ERROR_NOT_SUPPORTED; /* a MIG slice */
    memset(out, 0, sizeof *out);
    out->bus = index + 1;
    out->pciDeviceId = 0x268410DE;
    snprintf(out->busId, sizeof out->busId, "00000000:%02X:00.0", index + 1);
    snprintf(out->busIdLegacy, sizeof out->busIdLegacy, "0000:%02X:00.0", index + 1);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *out) { WITH_STATE(pci(st, h, out)); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *h, nvmlPciInfo_t *out) { WITH_STATE(pci(st, h, out)); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(void *h, nvmlPciInfo_t *out) { WITH_STATE(pci(st, h, out)); }

/* -- memory ------------------------------------------------------------------------------ */
static nvmlReturn_t memory(state_t *st, void *h, unsigned long long *total,
                           unsigned long long *used, unsigned long long *reserved, int v2) {
    const gpu_t *g = NULL;
    nvmlReturn_t ret = enter(&st, h, &g, 1);
    if (ret) return ret;
    if (g->memory) return g->memory;
    if (v2 && g->memory_v2_error) return g->memory_v2_error;
    long long u = g->used_mib > g->total_mib ? g->total_mib : g->used_mib;
    long long r = g->reserved_mib > u ? u : g->reserved_mib;
    *total = (unsigned long long)g->total_mib * MIB;
    *used = (unsigned long long)u * MIB;
    *reserved = (unsigned long long)r * MIB;
    return NVML_SUCCESS;
}
static nvmlReturn_t memory_v1(state_t *st, void *h, nvmlMemory_t *out) {
    unsigned long long total, used, reserved;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = memory(st, h, &total, &used, &reserved, 0);
    if (ret) return ret;
    out->total = total;
    out->used = used;
    out->free = total - used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *out) { WITH_STATE(memory_v1(st, h, out)); }

#ifndef RBROKER_OLD_DRIVER
static nvmlReturn_t memory_v2(state_t *st, void *h, nvmlMemory_v2_t *out) {
    unsigned long long total, used, reserved;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (out->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t ret = memory(st, h, &total, &used, &reserved, 1);
    if (ret) return ret;
    out->total = total;
    out->reserved = reserved;
    out->used = used - reserved;
    out->free = total - used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *out) {
    WITH_STATE(memory_v2(st, h, out));
}
#endif

/* -- processes --------------------------------------------------------------------------- */
static nvmlReturn_t processes(state_t *st, void *h, unsigned int *count, void *infos, int graphics,
                              int stride) {
    const gpu_t *g = NULL;
    nvmlReturn_t ret = enter(&st, h, &g, 1);
    if (ret) return ret;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->process_list_error) return g->process_list_error;
    unsigned int n = 0;
    for (int i = 0; i < g->nprocs; i++) n += g->procs[i].graphics == graphics;
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (int i = 0; i < g->nprocs; i++) {
        const proc_t *p = &g->procs[i];
        if (p->graphics != graphics) continue;
        unsigned char record[32];
        memset(record, 0, sizeof record);
        nvmlProcessInfo_v2_t v2;
        memset(&v2, 0, sizeof v2);
        v2.pid = p->pid;
        v2.usedGpuMemory = !g->per_process_memory || p->mib < 0 ? NOT_AVAILABLE
                                                                : (unsigned long long)p->mib * MIB;
        v2.gpuInstanceId = v2.computeInstanceId = 0xFFFFFFFFu;
        if (stride == (int)sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t v1 = {v2.pid, v2.usedGpuMemory};
            memcpy(record, &v1, sizeof v1);
        } else {
            memcpy(record, &v2, sizeof v2); /* wide: 8 bytes more of zeros */
        }
        memcpy((char *)infos + (size_t)k * (size_t)stride, record, (size_t)stride);
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}
#define PROCESS_LIST(NAME, GRAPHICS, STRIDE)                                            \
    EXPORT nvmlReturn_t NAME(void *h, unsigned int *count, void *infos) {               \
        WITH_STATE(processes(st, h, count, infos, GRAPHICS, st ? (STRIDE) : 24));        \
    }
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, 0, (int)sizeof(nvmlProcessInfo_v1_t))
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, 1, (int)sizeof(nvmlProcessInfo_v1_t))
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, 0, st->stride)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, 1, st->stride)
#ifndef RBROKER_OLD_DRIVER
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, 0, st->stride)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, 1, st->stride)
#endif

/* -- per-process utilization ------------------------------------------------------------ */
#ifndef RBROKER_OLD_DRIVER
/* The CPU time in microseconds since 1970, as NVML stamps samples; strictly increasing over
   the library's life (a clock of coarse resolution still gives each answer a newer stamp). */
static unsigned long long last_stamp_us;
static unsigned long long next_stamp_us(void) {
    unsigned long long now;
#ifdef _WIN32
    FILETIME ft;
    GetSystemTimeAsFileTime(&ft);
    now = ((((unsigned long long)ft.dwHighDateTime << 32) | ft.dwLowDateTime) -
           116444736000000000ULL) / 10ULL; /* 100 ns since 1601 -> us since 1970 */
#else
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    now = (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
#endif
    lock();
    if (now <= last_stamp_us) now = last_stamp_us + 1;
    last_stamp_us = now;
    unlock();
    return now;
}

/* nvmlDeviceGetProcessUtilization: one sample per process whose SM utilization is above 0,
   stamped now. As NVML: `utilization` NULL (or `*count` too small) answers
   NVML_ERROR_INSUFFICIENT_SIZE with the count needed; NVML_ERROR_NOT_FOUND when no sample is
   newer than `last_seen` (the newest timeStamp of an earlier answer; 0: every sample). */
static nvmlReturn_t process_utilization(state_t *st, void *h,
                                        nvmlProcessUtilizationSample_t *utilization,
                                        unsigned int *count, unsigned long long last_seen) {
    where_t w;
    nvmlReturn_t ret = enter_at(st, h, &w, 1);
    if (ret) return ret;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (w.slot >= 0) return NVML_ERROR_NOT_SUPPORTED; /* a MIG slice */
    if (w.gpu->utilization_error) return w.gpu->utilization_error;
    unsigned long long stamp = next_stamp_us();
    unsigned int n = 0;
    for (int i = 0; i < w.gpu->nprocs; i++) n += w.gpu->procs[i].sm_util > 0;
    if (n == 0 || stamp <= last_seen) return NVML_ERROR_NOT_FOUND;
    if (!utilization || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (int i = 0; i < w.gpu->nprocs; i++) {
        const proc_t *p = &w.gpu->procs[i];
        if (p->sm_util <= 0) continue;
        memset(&utilization[k], 0, sizeof utilization[k]);
        utilization[k].pid = p->pid;
        utilization[k].timeStamp = stamp;
        utilization[k].smUtil = (unsigned int)p->sm_util;
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(void *h,
                                                    nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *count,
                                                    unsigned long long last_seen) {
    WITH_STATE(process_utilization(st, h, utilization, count, last_seen));
}
#endif

/* -- MIG --------------------------------------------------------------------------------- */
static nvmlReturn_t whole(state_t *st, void *h, const gpu_t **out, int *index) {
    where_t w;
    nvmlReturn_t ret = enter_at(st, h, &w, 0);
    if (ret) return ret;
    if (w.slot >= 0) return NVML_ERROR_NOT_SUPPORTED; /* a slice itself */
    *out = w.gpu;
    if (index) *index = w.index;
    return w.gpu->mig < 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}
static nvmlReturn_t mig_mode(state_t *st, void *h, unsigned int *current, unsigned int *pending) {
    const gpu_t *g = NULL;
    nvmlReturn_t ret = whole(st, h, &g, NULL);
    if (ret) return ret;
    *current = *pending = g->mig > 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned int *current, unsigned int *pending) {
    WITH_STATE(mig_mode(st, h, current, pending));
}
static nvmlReturn_t mig_count(state_t *st, void *h, unsigned int *out) {
    const gpu_t *g = NULL;
    nvmlReturn_t ret = whole(st, h, &g, NULL);
    if (ret) return ret;
    *out = g->mig > 0 ? (unsigned int)g->mig : 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned int *out) {
    WITH_STATE(mig_count(st, h, out));
}
static nvmlReturn_t mig_handle(state_t *st, void *h, unsigned int index, void **out) {
    const gpu_t *g = NULL;
    int gpu = 0;
    nvmlReturn_t ret = whole(st, h, &g, &gpu);
    if (ret) return ret;
    if (g->mig <= 0 || index >= (unsigned int)g->mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned int)st->nslices[gpu]) return NVML_ERROR_NOT_FOUND; /* empty slot */
    *out = handle_for(st->slices[gpu][index].uuid);
    return *out ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned int index, void **out) {
    WITH_STATE(mig_handle(st, h, index, out));
}
static nvmlReturn_t is_slice(state_t *st, void *h, unsigned int *out) {
    where_t w;
    nvmlReturn_t ret = enter_at(st, h, &w, 0);
    if (ret) return ret;
    *out = w.slot >= 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned int *out) {
    WITH_STATE(is_slice(st, h, out));
}
