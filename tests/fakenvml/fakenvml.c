/* A fake libnvidia-ml.so.1 for tests and the demo.
 *
 * It implements the NVML entry points that gpuplace's agent reaches through pynvml, with the real
 * C signatures and structure layouts, so that pynvml's ctypes path runs unchanged. The devices come
 * from the JSON file named by GPUPLACE_FAKE_NVML_CONFIG (format: README.md). The file is read again
 * whenever it changes on disk, so a test can lose a GPU or raise an XID while the agent runs.
 *
 * Handles name NVML indices: the handle for index 2 stays valid across reloads and always means
 * "whatever the file now says index 2 is"; an index that disappears reads as a lost GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

#define EXPORT __attribute__((visibility("default")))

#define CONFIG_ENV "GPUPLACE_FAKE_NVML_CONFIG"
#define MAX_DEVICES 64
/* MIG devices one GPU can hold at most (an H100 or H200 holds 7). */
#define MAX_MIG 7
#define MAX_NVLINKS 18
#define MIB (1024ull * 1024ull)

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

static const struct {
    int code;
    const char *name;
    const char *text;
} ERRORS[] = {
    {0, "SUCCESS", "Success"},
    {1, "UNINITIALIZED", "Uninitialized"},
    {2, "INVALID_ARGUMENT", "Invalid Argument"},
    {3, "NOT_SUPPORTED", "Not Supported"},
    {4, "NO_PERMISSION", "Insufficient Permissions"},
    {5, "ALREADY_INITIALIZED", "Already Initialized"},
    {6, "NOT_FOUND", "Not Found"},
    {7, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {8, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {9, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {10, "TIMEOUT", "Timeout"},
    {11, "IRQ_ISSUE", "Interrupt Request Issue"},
    {12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {13, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {14, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {15, "GPU_IS_LOST", "GPU is lost"},
    {16, "RESET_REQUIRED", "GPU requires restart"},
    {17, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {18, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {19, "IN_USE", "In use by another client"},
    {20, "MEMORY", "Insufficient Memory"},
    {21, "NO_DATA", "No data"},
    {23, "INSUFFICIENT_RESOURCES", "Insufficient resources"},
    {25, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"},
    {27, "NOT_READY", "Not ready"},
    {28, "GPU_NOT_FOUND", "GPU not found"},
    {29, "INVALID_STATE", "Invalid state"},
    {999, "UNKNOWN", "Unknown Error"},
};

/* Event types (nvml.h). Only XID critical errors are ever raised; the others are advertised so
 * that the agent's "register only what is supported" logic has something to mask. */
#define EVENT_SINGLE_BIT_ECC 0x1ull
#define EVENT_DOUBLE_BIT_ECC 0x2ull
#define EVENT_XID_CRITICAL 0x8ull
#define EVENT_SUPPORTED (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL)

/* Per-device calls that "failCalls" can name. */
enum call {
    CALL_HANDLE_BY_INDEX,
    CALL_HANDLE_BY_UUID,
    CALL_HANDLE_BY_PCI,
    CALL_INDEX,
    CALL_UUID,
    CALL_NAME,
    CALL_MEMORY,
    CALL_PCI,
    CALL_NUMA,
    CALL_MINOR,
    CALL_SUPPORTED_EVENTS,
    CALL_REGISTER_EVENTS,
    CALL_MIG_MODE,
    CALL_MIG_HANDLE,
    CALL_GPU_INSTANCE,
    CALL_NVLINK_STATE,
    CALL_NVLINK_REMOTE,
    CALL_TOPOLOGY,
    CALL_COUNT_
};

static const char *const CALL_NAMES[CALL_COUNT_] = {
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetTopologyCommonAncestor",
};

/* ---- NVML structures, laid out as in nvml.h ------------------------------------------------ */

/* `mig` is 0 for a whole GPU and 1 + the MIG device index for a MIG device on it. */
typedef struct nvmlDevice_st {
    unsigned index;
    unsigned mig;
} *nvmlDevice_t;

/* A GPU instance handle: the parent GPU's index and the instance's position in its list. */
typedef struct nvmlGpuInstance_st {
    unsigned index;
    unsigned position;
} *nvmlGpuInstance_t;

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

#define NVML_GPU_INSTANCE_PROFILE_INFO_V2 \
    ((unsigned)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24)))

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
} nvmlEventData_v1_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* ---- configuration -------------------------------------------------------------------------- */

struct mig_config {
    char uuid[96];
    char profile[32]; /* "3g.40gb", as the profile's name after "MIG " */
    char name[96];    /* nvmlDeviceGetName; empty: "<GPU name> MIG <profile>" */
    unsigned index;   /* MIG device index on the parent */
    unsigned gi_id, ci_id, profile_id;
    unsigned start, size;
    unsigned long long memory; /* bytes */
};

struct nvlink_config {
    unsigned link;
    int active;
    int remote_is_switch;
    char remote_bus_id[32];
    unsigned remote_domain, remote_bus, remote_device, remote_function;
};

struct device_config {
    char uuid[96];
    char name[96];
    char pci_bus_id[32];
    unsigned pci_domain, pci_bus, pci_device, pci_function;
    unsigned pci_device_id, pci_subsystem_id;
    unsigned long long memory_total, memory_used, memory_reserved; /* bytes */
    int has_numa;
    int numa_node;
    unsigned minor;
    nvmlReturn_t fail;
    unsigned fail_calls; /* bit per enum call; 0 means every per-device call */
    unsigned long long xid;
    int events;
    int mig_supported, mig_mode; /* mig_supported: the file has "migMode" (true or false) */
    unsigned mig_count;
    struct mig_config migs[MAX_MIG];
    int has_nvlinks;
    unsigned nvlink_count;
    struct nvlink_config nvlinks[MAX_NVLINKS];
};

struct config {
    char driver_version[80];
    char nvml_version[80];
    int cuda_version;
    nvmlReturn_t init_error;
    int event_sets;
    unsigned count;
    struct device_config devices[MAX_DEVICES];
    /* PCIe topology: the level (NVML_TOPOLOGY_*) shared by each pair of devices. */
    int has_topology;
    unsigned char topology[MAX_DEVICES][MAX_DEVICES];
};

struct stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

#define EVENT_SET_MAGIC 0x6e766d6cu

struct nvmlEventSet_st {
    unsigned magic;
    unsigned long long registered[MAX_DEVICES];
    unsigned long long seen[MAX_DEVICES]; /* last XID sequence delivered, per index */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_count;
static int g_loaded;
static struct config g_config;
static struct stamp g_stamp, g_bad_stamp;
static int g_have_bad_stamp;
static int g_warned_unset;
/* Bumped whenever a device's "xid" takes a new non-zero value; event sets deliver each once. */
static unsigned long long g_xid_seq[MAX_DEVICES];
static struct nvmlDevice_st g_handles[MAX_DEVICES];
static struct nvmlDevice_st g_mig_handles[MAX_DEVICES][MAX_MIG];
static struct nvmlGpuInstance_st g_gi_handles[MAX_DEVICES][MAX_MIG];

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fakenvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int same_stamp(const struct stamp *a, const struct stamp *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

static struct stamp stamp_of(const struct stat *st) {
    struct stamp s = {st->st_dev, st->st_ino, st->st_size, st->st_mtim};
    return s;
}

/* ---- configuration parsing ------------------------------------------------------------------ */

typedef struct {
    const char *path;
    char *error;
    size_t error_size;
} ctx;

static int bad(ctx *c, const json_value *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int report(ctx *c, int line, int column, const char *fmt, va_list ap) {
    int n = snprintf(c->error, c->error_size, "%s:%d:%d: ", c->path, line, column);
    if (n >= 0 && (size_t)n < c->error_size) vsnprintf(c->error + n, c->error_size - (size_t)n, fmt, ap);
    return 0;
}

static int bad_key(ctx *c, const json_value *member, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad_key(ctx *c, const json_value *member, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(c, member->key_line, member->key_column, fmt, ap);
    va_end(ap);
    return 0;
}

static int bad(ctx *c, const json_value *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(c, at ? at->line : 1, at ? at->column : 1, fmt, ap);
    va_end(ap);
    return 0;
}

static int error_code(const char *name, nvmlReturn_t *out) {
    if (strncmp(name, "NVML_ERROR_", 11) == 0) name += 11;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (ERRORS[i].code != 0 && strcmp(ERRORS[i].name, name) == 0) {
            *out = ERRORS[i].code;
            return 1;
        }
    }
    return 0;
}

static int want_string(ctx *c, const json_value *v, const char *what, char *out, size_t size) {
    if (v->type != JSON_STRING) return bad(c, v, "%s must be a string, got %s", what, json_type_name(v->type));
    if (strlen(v->string) >= size) return bad(c, v, "%s is longer than %zu bytes", what, size - 1);
    strcpy(out, v->string);
    return 1;
}

static int want_int(ctx *c, const json_value *v, const char *what, long long min, long long max,
                    long long *out) {
    if (v->type != JSON_NUMBER || !v->is_integer) {
        return bad(c, v, "%s must be an integer, got %s", what,
                   v->type == JSON_NUMBER ? "a fraction" : json_type_name(v->type));
    }
    if (v->integer < min || v->integer > max) {
        return bad(c, v, "%s must be between %lld and %lld, got %lld", what, min, max, v->integer);
    }
    *out = v->integer;
    return 1;
}

static int want_bool(ctx *c, const json_value *v, const char *what, int *out) {
    if (v->type != JSON_BOOL) return bad(c, v, "%s must be true or false, got %s", what, json_type_name(v->type));
    *out = v->boolean;
    return 1;
}

static int want_error(ctx *c, const json_value *v, const char *what, nvmlReturn_t *out) {
    if (v->type == JSON_NULL) {
        *out = NVML_SUCCESS;
        return 1;
    }
    if (v->type != JSON_STRING || !error_code(v->string, out)) {
        return bad(c, v, "%s must be an NVML error name such as \"GPU_IS_LOST\" or null", what);
    }
    return 1;
}

/* Accepts "0000:17:00.0" and "00000000:17:00.0" (domain:bus:device.function, hex). */
static int parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *device,
                        unsigned *function) {
    char tail;
    return sscanf(text, "%x:%x:%x.%x%c", domain, bus, device, function, &tail) == 4 &&
           *bus <= 0xFF && *device <= 0x1F && *function <= 7;
}

static int check_keys(ctx *c, const json_value *object, const char *const *allowed, const char *where) {
    for (size_t i = 0; i < object->count; i++) {
        int known = 0;
        for (const char *const *k = allowed; *k; k++) known |= strcmp(*k, object->items[i].key) == 0;
        if (!known) {
            return bad_key(c, &object->items[i], "unknown key \"%s\" in %s", object->items[i].key, where);
        }
    }
    return 1;
}

static const char *const DEVICE_KEYS[] = {
    "index", "uuid", "name", "memoryTotalMiB", "memoryUsedMiB", "memoryReservedMiB", "pciBusId",
    "pciDeviceId", "pciSubSystemId", "numaNode", "minorNumber", "fail", "failCalls", "xid",
    "events", "migMode", "migInstances", "nvlinks", NULL};

static const char *const MIG_KEYS[] = {"uuid", "profile", "name", "index", "gpuInstanceId",
                                       "computeInstanceId", "giProfileId", "placement",
                                       "memoryMiB", NULL};

/* The NVML GPU instance profile ID of a profile name, as H100, H200 and A100 number them by
 * compute slices ("nvidia-smi mig -lgip"); other shapes must give "giProfileId". */
static int default_profile_id(const char *profile, unsigned *out) {
    unsigned slices;
    char tail[32];
    if (sscanf(profile, "%ug.%31s", &slices, tail) != 2) return 0;
    if (strstr(tail, "+me")) {
        if (slices != 1) return 0;
        *out = 20;
        return 1;
    }
    switch (slices) {
    case 1: *out = 19; return 1;
    case 2: *out = 14; return 1;
    case 3: *out = 9; return 1;
    case 4: *out = 5; return 1;
    case 7: *out = 0; return 1;
    default: return 0;
    }
}

static int parse_mig(ctx *c, const json_value *v, const char *where, unsigned position,
                     struct mig_config *m) {
    long long n;
    const json_value *f;
    if (v->type != JSON_OBJECT) return bad(c, v, "%s must be an object", where);
    if (!check_keys(c, v, MIG_KEYS, where)) return 0;
    memset(m, 0, sizeof *m);
    if (!(f = json_get(v, "uuid"))) return bad(c, v, "%s has no \"uuid\"", where);
    if (!want_string(c, f, "uuid", m->uuid, sizeof m->uuid)) return 0;
    if (strncmp(m->uuid, "MIG-", 4) != 0) return bad(c, f, "a MIG device's uuid starts with \"MIG-\"");
    if (!(f = json_get(v, "profile"))) return bad(c, v, "%s has no \"profile\" (e.g. \"3g.40gb\")", where);
    if (!want_string(c, f, "profile", m->profile, sizeof m->profile)) return 0;
    unsigned slices;
    char tail[32];
    if (sscanf(m->profile, "%ug.%31s", &slices, tail) != 2 || !slices) {
        return bad(c, f, "profile \"%s\" is not <slices>g.<memory>gb, e.g. 3g.40gb", m->profile);
    }
    if ((f = json_get(v, "name")) && !want_string(c, f, "name", m->name, sizeof m->name)) return 0;
    m->index = position;
    if ((f = json_get(v, "index"))) {
        if (!want_int(c, f, "index", 0, MAX_MIG - 1, &n)) return 0;
        m->index = (unsigned)n;
    }
    m->gi_id = position + 1;
    if ((f = json_get(v, "gpuInstanceId"))) {
        if (!want_int(c, f, "gpuInstanceId", 0, 0xFFFF, &n)) return 0;
        m->gi_id = (unsigned)n;
    }
    if ((f = json_get(v, "computeInstanceId"))) {
        if (!want_int(c, f, "computeInstanceId", 0, 0xFFFF, &n)) return 0;
        m->ci_id = (unsigned)n;
    }
    if ((f = json_get(v, "giProfileId"))) {
        if (!want_int(c, f, "giProfileId", 0, 0xFFFF, &n)) return 0;
        m->profile_id = (unsigned)n;
    } else if (!default_profile_id(m->profile, &m->profile_id)) {
        return bad(c, v, "%s: give \"giProfileId\" for profile %s", where, m->profile);
    }
    /* Placements count memory slices: a 3g instance takes 4 of the 8 on H100 and H200. */
    m->size = slices == 3 ? 4 : slices;
    if ((f = json_get(v, "placement"))) {
        const json_value *start = json_get(f, "start"), *size = json_get(f, "size");
        if (f->type != JSON_OBJECT || !start || !size || f->count != 2) {
            return bad(c, f, "placement must be {\"start\": <slice>, \"size\": <slices>}");
        }
        if (!want_int(c, start, "placement.start", 0, 7, &n)) return 0;
        m->start = (unsigned)n;
        if (!want_int(c, size, "placement.size", 1, 8, &n)) return 0;
        m->size = (unsigned)n;
    }
    if ((f = json_get(v, "memoryMiB"))) {
        if (!want_int(c, f, "memoryMiB", 0, 1ll << 40, &n)) return 0;
        m->memory = (unsigned long long)n * MIB;
    }
    return 1;
}

static int parse_migs(ctx *c, const json_value *list, const char *where, struct device_config *d) {
    char at[64];
    if (list->type != JSON_ARRAY) return bad(c, list, "migInstances must be an array");
    if (list->count > MAX_MIG) return bad(c, list, "at most %d MIG devices a GPU", MAX_MIG);
    if (list->count && !d->mig_mode) return bad(c, list, "%s has migInstances but \"migMode\" is not true", where);
    for (size_t i = 0; i < list->count; i++) {
        snprintf(at, sizeof at, "%s.migInstances[%zu]", where, i);
        struct mig_config *m = &d->migs[i];
        if (!parse_mig(c, &list->items[i], at, (unsigned)i, m)) return 0;
        for (size_t j = 0; j < i; j++) {
            const struct mig_config *o = &d->migs[j];
            if (o->index == m->index) return bad(c, &list->items[i], "%s: MIG device index %u is taken", at, m->index);
            if (o->gi_id == m->gi_id) return bad(c, &list->items[i], "%s: gpuInstanceId %u is taken", at, m->gi_id);
            if (strcmp(o->uuid, m->uuid) == 0) return bad(c, &list->items[i], "%s: uuid %s is taken", at, m->uuid);
            if (o->profile_id == m->profile_id && strcmp(o->profile, m->profile) != 0) {
                return bad(c, &list->items[i], "%s: profiles %s and %s share giProfileId %u", at, o->profile,
                           m->profile, m->profile_id);
            }
        }
    }
    d->mig_count = (unsigned)list->count;
    return 1;
}

static int parse_nvlinks(ctx *c, const json_value *list, const char *where, struct device_config *d) {
    static const char *const keys[] = {"link", "active", "remotePciBusId", "remote", NULL};
    char at[64];
    long long n;
    const json_value *f;
    if (list->type != JSON_ARRAY) return bad(c, list, "nvlinks must be an array");
    if (list->count > MAX_NVLINKS) return bad(c, list, "at most %d NVLinks a GPU", MAX_NVLINKS);
    d->has_nvlinks = 1;
    for (size_t i = 0; i < list->count; i++) {
        const json_value *v = &list->items[i];
        struct nvlink_config *l = &d->nvlinks[i];
        snprintf(at, sizeof at, "%s.nvlinks[%zu]", where, i);
        if (v->type != JSON_OBJECT) return bad(c, v, "%s must be an object", at);
        if (!check_keys(c, v, keys, at)) return 0;
        memset(l, 0, sizeof *l);
        l->link = (unsigned)i;
        if ((f = json_get(v, "link"))) {
            if (!want_int(c, f, "link", 0, MAX_NVLINKS - 1, &n)) return 0;
            l->link = (unsigned)n;
        }
        for (size_t j = 0; j < i; j++) {
            if (d->nvlinks[j].link == l->link) return bad(c, v, "%s: link %u is listed twice", at, l->link);
        }
        l->active = 1;
        if ((f = json_get(v, "active")) && !want_bool(c, f, "active", &l->active)) return 0;
        if (!(f = json_get(v, "remotePciBusId"))) return bad(c, v, "%s has no \"remotePciBusId\"", at);
        if (!want_string(c, f, "remotePciBusId", l->remote_bus_id, sizeof l->remote_bus_id)) return 0;
        if (!parse_bus_id(l->remote_bus_id, &l->remote_domain, &l->remote_bus, &l->remote_device,
                          &l->remote_function)) {
            return bad(c, f, "remotePciBusId \"%s\" is not domain:bus:device.function", l->remote_bus_id);
        }
        snprintf(l->remote_bus_id, sizeof l->remote_bus_id, "%08X:%02X:%02X.%X", l->remote_domain,
                 l->remote_bus, l->remote_device, l->remote_function);
        if ((f = json_get(v, "remote"))) {
            if (f->type != JSON_STRING || (strcmp(f->string, "gpu") && strcmp(f->string, "switch"))) {
                return bad(c, f, "remote must be \"gpu\" or \"switch\"");
            }
            l->remote_is_switch = strcmp(f->string, "switch") == 0;
        }
    }
    d->nvlink_count = (unsigned)list->count;
    return 1;
}

static int parse_device(ctx *c, const json_value *v, unsigned position, struct device_config *d) {
    long long n;
    const json_value *f;
    char where[32];
    snprintf(where, sizeof where, "devices[%u]", position);
    if (v->type != JSON_OBJECT) return bad(c, v, "%s must be an object", where);
    if (!check_keys(c, v, DEVICE_KEYS, where)) return 0;
    memset(d, 0, sizeof *d);
    d->events = 1;
    d->minor = position;
    snprintf(d->name, sizeof d->name, "NVIDIA Fake GPU");
    snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", 0x10 + position);
    if ((f = json_get(v, "index"))) {
        if (!want_int(c, f, "index", 0, MAX_DEVICES - 1, &n)) return 0;
        if ((unsigned)n != position) {
            return bad(c, f, "index %lld is at position %u: list devices in NVML index order", n, position);
        }
    }
    if (!(f = json_get(v, "uuid"))) return bad(c, v, "%s has no \"uuid\"", where);
    if (!want_string(c, f, "uuid", d->uuid, sizeof d->uuid)) return 0;
    if (!d->uuid[0]) return bad(c, f, "uuid must not be empty");
    if ((f = json_get(v, "name")) && !want_string(c, f, "name", d->name, sizeof d->name)) return 0;
    if ((f = json_get(v, "memoryTotalMiB"))) {
        if (!want_int(c, f, "memoryTotalMiB", 0, 1ll << 40, &n)) return 0;
        d->memory_total = (unsigned long long)n * MIB;
    }
    if ((f = json_get(v, "memoryUsedMiB"))) {
        if (!want_int(c, f, "memoryUsedMiB", 0, 1ll << 40, &n)) return 0;
        d->memory_used = (unsigned long long)n * MIB;
    }
    if ((f = json_get(v, "memoryReservedMiB"))) {
        if (!want_int(c, f, "memoryReservedMiB", 0, 1ll << 40, &n)) return 0;
        d->memory_reserved = (unsigned long long)n * MIB;
    }
    if (d->memory_used + d->memory_reserved > d->memory_total) {
        return bad(c, v, "%s: memoryUsedMiB + memoryReservedMiB exceed memoryTotalMiB", where);
    }
    if ((f = json_get(v, "pciBusId")) && !want_string(c, f, "pciBusId", d->pci_bus_id, sizeof d->pci_bus_id)) {
        return 0;
    }
    if (!parse_bus_id(d->pci_bus_id, &d->pci_domain, &d->pci_bus, &d->pci_device, &d->pci_function)) {
        return bad(c, f ? f : v, "pciBusId \"%s\" is not domain:bus:device.function, e.g. 00000000:17:00.0",
                   d->pci_bus_id);
    }
    /* NVML reports the 8-digit-domain, upper-case form whatever the file says. */
    snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "%08X:%02X:%02X.%X", d->pci_domain, d->pci_bus,
             d->pci_device, d->pci_function);
    if ((f = json_get(v, "pciDeviceId"))) {
        if (!want_int(c, f, "pciDeviceId", 0, 0xFFFFFFFFll, &n)) return 0;
        d->pci_device_id = (unsigned)n;
    }
    if ((f = json_get(v, "pciSubSystemId"))) {
        if (!want_int(c, f, "pciSubSystemId", 0, 0xFFFFFFFFll, &n)) return 0;
        d->pci_subsystem_id = (unsigned)n;
    }
    if ((f = json_get(v, "numaNode")) && f->type != JSON_NULL) {
        if (!want_int(c, f, "numaNode", 0, 1023, &n)) return 0;
        d->has_numa = 1;
        d->numa_node = (int)n;
    }
    if ((f = json_get(v, "minorNumber"))) {
        if (!want_int(c, f, "minorNumber", 0, 255, &n)) return 0;
        d->minor = (unsigned)n;
    }
    if ((f = json_get(v, "fail")) && !want_error(c, f, "fail", &d->fail)) return 0;
    if ((f = json_get(v, "failCalls"))) {
        if (f->type != JSON_ARRAY) return bad(c, f, "failCalls must be an array of NVML function names");
        for (size_t i = 0; i < f->count; i++) {
            const json_value *name = &f->items[i];
            int found = -1;
            if (name->type == JSON_STRING) {
                for (int k = 0; k < CALL_COUNT_; k++) {
                    if (strcmp(CALL_NAMES[k], name->string) == 0) found = k;
                }
            }
            if (found < 0) {
                return bad(c, name, "failCalls entries must name a per-device call without version "
                                    "suffix, e.g. \"nvmlDeviceGetMemoryInfo\"");
            }
            d->fail_calls |= 1u << found;
        }
    }
    if ((f = json_get(v, "xid")) && f->type != JSON_NULL) {
        if (!want_int(c, f, "xid", 0, 0xFFFFFFFFll, &n)) return 0;
        d->xid = (unsigned long long)n;
    }
    if ((f = json_get(v, "events")) && !want_bool(c, f, "events", &d->events)) return 0;
    if ((f = json_get(v, "migMode")) && f->type != JSON_NULL) {
        if (!want_bool(c, f, "migMode", &d->mig_mode)) return 0;
        d->mig_supported = 1;
    }
    if ((f = json_get(v, "migInstances")) && !parse_migs(c, f, where, d)) return 0;
    if ((f = json_get(v, "nvlinks")) && !parse_nvlinks(c, f, where, d)) return 0;
    return 1;
}

static const struct {
    const char *name;
    unsigned char level;
} TOPOLOGY_LEVELS[] = {{"INTERNAL", 0},   {"SINGLE", 10}, {"MULTIPLE", 20},
                       {"HOSTBRIDGE", 30}, {"NODE", 40},  {"SYSTEM", 50}};

static int want_level(ctx *c, const json_value *v, unsigned char *out) {
    if (v->type == JSON_STRING) {
        for (size_t i = 0; i < sizeof TOPOLOGY_LEVELS / sizeof TOPOLOGY_LEVELS[0]; i++) {
            if (strcmp(v->string, TOPOLOGY_LEVELS[i].name) == 0) {
                *out = TOPOLOGY_LEVELS[i].level;
                return 1;
            }
        }
    }
    return bad(c, v, "a topology level is one of INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM");
}

/* "topology": {"default": "SYSTEM", "groups": [{"level": "SINGLE", "devices": [0, 1]}, ...]}: two
 * devices share the closest level of any group holding both, else the default. */
static int parse_topology(ctx *c, const json_value *v, struct config *cfg) {
    static const char *const keys[] = {"default", "groups", NULL};
    static const char *const group_keys[] = {"level", "devices", NULL};
    unsigned char fallback = 50;
    const json_value *f;
    if (v->type != JSON_OBJECT) return bad(c, v, "topology must be an object");
    if (!check_keys(c, v, keys, "topology")) return 0;
    if ((f = json_get(v, "default")) && !want_level(c, f, &fallback)) return 0;
    memset(cfg->topology, fallback, sizeof cfg->topology);
    if ((f = json_get(v, "groups"))) {
        if (f->type != JSON_ARRAY) return bad(c, f, "topology.groups must be an array");
        for (size_t g = 0; g < f->count; g++) {
            const json_value *group = &f->items[g], *level_v, *members;
            unsigned char level;
            if (group->type != JSON_OBJECT) return bad(c, group, "topology.groups[%zu] must be an object", g);
            if (!check_keys(c, group, group_keys, "a topology group")) return 0;
            if (!(level_v = json_get(group, "level")) || !want_level(c, level_v, &level)) {
                return level_v ? 0 : bad(c, group, "topology.groups[%zu] has no \"level\"", g);
            }
            if (!(members = json_get(group, "devices")) || members->type != JSON_ARRAY) {
                return bad(c, group, "topology.groups[%zu] needs \"devices\": [<index>, ...]", g);
            }
            for (size_t i = 0; i < members->count; i++) {
                long long a, b;
                if (!want_int(c, &members->items[i], "a device index", 0, (long long)cfg->count - 1, &a)) return 0;
                for (size_t j = 0; j < members->count; j++) {
                    if (!want_int(c, &members->items[j], "a device index", 0, (long long)cfg->count - 1, &b)) {
                        return 0;
                    }
                    if (level < cfg->topology[a][b]) cfg->topology[a][b] = level;
                }
            }
        }
    }
    for (unsigned i = 0; i < MAX_DEVICES; i++) cfg->topology[i][i] = 0;
    cfg->has_topology = 1;
    return 1;
}

static const char *const TOP_KEYS[] = {"driverVersion", "nvmlVersion", "cudaDriverVersion",
                                       "initError", "eventSets", "devices", "topology", NULL};

static int parse_config(ctx *c, const json_value *root, struct config *cfg) {
    long long n;
    const json_value *f;
    memset(cfg, 0, sizeof *cfg);
    cfg->event_sets = 1;
    snprintf(cfg->driver_version, sizeof cfg->driver_version, "550.54.15");
    cfg->cuda_version = 12040;
    if (root->type != JSON_OBJECT) return bad(c, root, "the configuration must be a JSON object");
    if (!check_keys(c, root, TOP_KEYS, "the configuration")) return 0;
    if ((f = json_get(root, "driverVersion")) &&
        !want_string(c, f, "driverVersion", cfg->driver_version, sizeof cfg->driver_version)) {
        return 0;
    }
    if ((f = json_get(root, "nvmlVersion"))) {
        if (!want_string(c, f, "nvmlVersion", cfg->nvml_version, sizeof cfg->nvml_version)) return 0;
    } else {
        /* Real libraries report "<CUDA major>.<driver version>", e.g. 12.550.54.15. */
        snprintf(cfg->nvml_version, sizeof cfg->nvml_version, "%d.%.60s", 12, cfg->driver_version);
    }
    if ((f = json_get(root, "cudaDriverVersion"))) {
        if (f->type == JSON_STRING) {
            unsigned major, minor;
            char tail;
            if (sscanf(f->string, "%u.%u%c", &major, &minor, &tail) != 2 || minor > 99 || major > 999) {
                return bad(c, f, "cudaDriverVersion must look like \"12.4\" or be an integer like 12040");
            }
            cfg->cuda_version = (int)(major * 1000 + minor * 10);
        } else {
            if (!want_int(c, f, "cudaDriverVersion", 0, 999999, &n)) return 0;
            cfg->cuda_version = (int)n;
        }
    }
    if ((f = json_get(root, "initError")) && !want_error(c, f, "initError", &cfg->init_error)) return 0;
    if ((f = json_get(root, "eventSets")) && !want_bool(c, f, "eventSets", &cfg->event_sets)) return 0;
    if ((f = json_get(root, "devices"))) {
        if (f->type != JSON_ARRAY) return bad(c, f, "devices must be an array");
        if (f->count > MAX_DEVICES) return bad(c, f, "at most %d devices are supported", MAX_DEVICES);
        for (size_t i = 0; i < f->count; i++) {
            if (!parse_device(c, &f->items[i], (unsigned)i, &cfg->devices[i])) return 0;
            for (size_t j = 0; j < i; j++) {
                if (strcmp(cfg->devices[i].uuid, cfg->devices[j].uuid) == 0) {
                    return bad(c, &f->items[i], "uuid %s is also used by devices[%zu]", cfg->devices[i].uuid, j);
                }
            }
            for (size_t j = 0; j < i; j++) {
                for (unsigned k = 0; k < cfg->devices[i].mig_count; k++) {
                    for (unsigned l = 0; l < cfg->devices[j].mig_count; l++) {
                        if (strcmp(cfg->devices[i].migs[k].uuid, cfg->devices[j].migs[l].uuid) == 0) {
                            return bad(c, &f->items[i], "MIG uuid %s is also used by devices[%zu]",
                                       cfg->devices[i].migs[k].uuid, j);
                        }
                    }
                }
            }
        }
        cfg->count = (unsigned)f->count;
    }
    /* After the devices: the groups name device indices, checked against the count. */
    if ((f = json_get(root, "topology")) && !parse_topology(c, f, cfg)) return 0;
    return 1;
}

/* Reads the configuration file if it changed since the last read. Returns NVML_SUCCESS when a
 * configuration is in effect. A file that turns unreadable or invalid while one is in effect is
 * reported once and the previous configuration stays, as a half-written file must not make GPUs
 * vanish. Called with g_lock held. */
static nvmlReturn_t refresh(void) {
    const char *path = getenv(CONFIG_ENV);
    if (!path || !*path) {
        if (!g_warned_unset) warn("%s is not set; reporting no NVIDIA driver", CONFIG_ENV);
        g_warned_unset = 1;
        return g_loaded ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        if (!g_loaded) {
            warn("cannot read %s: %s; reporting no NVIDIA driver", path, strerror(errno));
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        return NVML_SUCCESS;
    }
    struct stamp now = stamp_of(&st);
    if (g_loaded && same_stamp(&now, &g_stamp)) return NVML_SUCCESS;
    if (g_have_bad_stamp && same_stamp(&now, &g_bad_stamp)) {
        return g_loaded ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    }

    char error[512] = "";
    ctx c = {path, error, sizeof error};
    struct config *cfg = NULL;
    char *text = NULL;
    json_value *root = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(error, sizeof error, "%s: %s", path, strerror(errno));
        goto failed;
    }
    now = stamp_of(&st);
    if (st.st_size > (off_t)JSON_MAX_INPUT) {
        snprintf(error, sizeof error, "%s: larger than %u bytes", path, JSON_MAX_INPUT);
        goto failed;
    }
    text = malloc((size_t)st.st_size + 1);
    cfg = malloc(sizeof *cfg);
    if (!text || !cfg) {
        snprintf(error, sizeof error, "%s: out of memory", path);
        goto failed;
    }
    size_t len = 0;
    while (len < (size_t)st.st_size) {
        ssize_t r = read(fd, text + len, (size_t)st.st_size - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    char jerror[256];
    root = json_parse(text, len, jerror, sizeof jerror);
    if (!root) {
        snprintf(error, sizeof error, "%s:%s", path, jerror);
        goto failed;
    }
    if (!parse_config(&c, root, cfg)) goto failed;

    for (unsigned i = 0; i < cfg->count; i++) {
        unsigned long long before = g_loaded && i < g_config.count ? g_config.devices[i].xid : 0;
        if (cfg->devices[i].xid && cfg->devices[i].xid != before) g_xid_seq[i]++;
    }
    g_config = *cfg;
    g_loaded = 1;
    g_stamp = now;
    g_have_bad_stamp = 0;
    free(cfg);
    free(text);
    json_free(root);
    close(fd);
    return NVML_SUCCESS;

failed:
    warn("%s%s", error, g_loaded ? " (keeping the previous configuration)" : "");
    g_bad_stamp = now;
    g_have_bad_stamp = 1;
    free(cfg);
    free(text);
    json_free(root);
    if (fd >= 0) close(fd);
    return g_loaded ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* ---- helpers for entry points (all called with g_lock held) -------------------------------- */

#define LOCKED_BEGIN()                       \
    pthread_mutex_lock(&g_lock);             \
    nvmlReturn_t ret = ready();              \
    if (ret != NVML_SUCCESS) goto out

#define LOCKED_END()                         \
    out:                                     \
    pthread_mutex_unlock(&g_lock);           \
    return ret

static nvmlReturn_t ready(void) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    refresh();
    return NVML_SUCCESS;
}

static nvmlReturn_t device_fault(const struct device_config *d, enum call call) {
    if (d->fail && (d->fail_calls == 0 || (d->fail_calls & (1u << call)))) return d->fail;
    return NVML_SUCCESS;
}

static nvmlReturn_t lookup(nvmlDevice_t handle, enum call call, struct device_config **out) {
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)g_handles;
    if (!handle || p < base || p >= base + sizeof g_handles || (p - base) % sizeof g_handles[0]) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (handle->index >= g_config.count) return NVML_ERROR_GPU_IS_LOST;
    struct device_config *d = &g_config.devices[handle->index];
    nvmlReturn_t fault = device_fault(d, call);
    if (fault) return fault;
    *out = d;
    return NVML_SUCCESS;
}

/* lookup() for a query that writes its answer through `result`: a null `result` is an invalid
 * argument, reported only once the handle itself has been accepted (as the real library does). */
static nvmlReturn_t lookup_into(nvmlDevice_t handle, enum call call, const void *result,
                                struct device_config **out) {
    nvmlReturn_t ret = lookup(handle, call, out);
    if (ret == NVML_SUCCESS && !result) ret = NVML_ERROR_INVALID_ARGUMENT;
    return ret;
}

static nvmlReturn_t copy_string(char *out, unsigned length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static nvmlDevice_t handle_of(unsigned index) {
    g_handles[index].index = index;
    g_handles[index].mig = 0;
    return &g_handles[index];
}

static int within(const void *handle, const void *array, size_t size, size_t item) {
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)array;
    return handle && p >= base && p < base + size && (p - base) % item == 0;
}

static int is_mig_handle(nvmlDevice_t handle) {
    return within(handle, g_mig_handles, sizeof g_mig_handles, sizeof g_mig_handles[0][0]);
}

/* The MIG device a MIG handle names, like lookup() for GPUs; the parent's faults apply to it. A
 * MIG device that the file no longer lists (or whose parent left MIG mode) is NOT_FOUND. */
static nvmlReturn_t mig_lookup(nvmlDevice_t handle, enum call call, struct device_config **parent,
                               struct mig_config **out) {
    if (!is_mig_handle(handle)) return NVML_ERROR_INVALID_ARGUMENT;
    if (handle->index >= g_config.count) return NVML_ERROR_GPU_IS_LOST;
    struct device_config *d = &g_config.devices[handle->index];
    nvmlReturn_t fault = device_fault(d, call);
    if (fault) return fault;
    for (unsigned i = 0; d->mig_mode && i < d->mig_count; i++) {
        if (d->migs[i].index + 1 == handle->mig) {
            *parent = d;
            *out = &d->migs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- initialization ------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = refresh();
    if (ret == NVML_SUCCESS && g_config.init_error) ret = g_config.init_error;
    if (ret == NVML_SUCCESS) g_init_count++;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (g_init_count) {
        g_init_count--;
    } else {
        ret = NVML_ERROR_UNINITIALIZED;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (ERRORS[i].code == result) return ERRORS[i].text;
    }
    return "Unknown Error";
}

/* ---- system queries ------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    LOCKED_BEGIN();
    ret = copy_string(version, length, g_config.driver_version);
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    LOCKED_BEGIN();
    ret = copy_string(version, length, g_config.nvml_version);
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    /* Like the real library, this one works without nvmlInit. */
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = refresh();
    if (ret == NVML_SUCCESS) *version = g_config.cuda_version;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    LOCKED_BEGIN();
    if (!count) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    *count = g_config.count;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* ---- handles -------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    LOCKED_BEGIN();
    if (!device || index >= g_config.count) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    ret = device_fault(&g_config.devices[index], CALL_HANDLE_BY_INDEX);
    if (ret == NVML_SUCCESS) *device = handle_of(index);
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    LOCKED_BEGIN();
    if (!uuid || !device) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    ret = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < g_config.count; i++) {
        if (strcmp(g_config.devices[i].uuid, uuid) == 0) {
            ret = device_fault(&g_config.devices[i], CALL_HANDLE_BY_UUID);
            if (ret == NVML_SUCCESS) *device = handle_of(i);
            break;
        }
    }
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    LOCKED_BEGIN();
    unsigned domain, bus, dev, function;
    if (!bus_id || !device || !parse_bus_id(bus_id, &domain, &bus, &dev, &function)) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    ret = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < g_config.count; i++) {
        const struct device_config *d = &g_config.devices[i];
        if (d->pci_domain == domain && d->pci_bus == bus && d->pci_device == dev && d->pci_function == function) {
            ret = device_fault(d, CALL_HANDLE_BY_PCI);
            if (ret == NVML_SUCCESS) *device = handle_of(i);
            break;
        }
    }
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* ---- per-device queries --------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup_into(device, CALL_INDEX, index, &d))) goto out;
    *index = device->index;
    LOCKED_END();
}

/* A query that copies the string field at `field` of a device's configuration to the caller. */
static nvmlReturn_t device_string(nvmlDevice_t device, enum call call, size_t field, char *out,
                                  unsigned length) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup(device, call, &d))) goto out;
    ret = copy_string(out, length, (const char *)d + field);
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (is_mig_handle(device)) {
        LOCKED_BEGIN();
        struct device_config *d;
        struct mig_config *m;
        if ((ret = mig_lookup(device, CALL_UUID, &d, &m))) goto out;
        ret = copy_string(uuid, length, m->uuid);
        LOCKED_END();
    }
    return device_string(device, CALL_UUID, offsetof(struct device_config, uuid), uuid, length);
}

/* A MIG device is named after its parent and profile, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", as
 * nvidia-smi -L shows it. */
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (is_mig_handle(device)) {
        LOCKED_BEGIN();
        struct device_config *d;
        struct mig_config *m;
        char text[160];
        if ((ret = mig_lookup(device, CALL_NAME, &d, &m))) goto out;
        if (m->name[0]) {
            snprintf(text, sizeof text, "%s", m->name);
        } else {
            snprintf(text, sizeof text, "%s MIG %s", d->name, m->profile);
        }
        ret = copy_string(name, length, text);
        LOCKED_END();
    }
    return device_string(device, CALL_NAME, offsetof(struct device_config, name), name, length);
}

/* Memory of a MIG device: its own, all free (the fake runs no processes). */
static nvmlReturn_t mig_memory(nvmlDevice_t device, const void *result, unsigned long long *total) {
    struct device_config *d;
    struct mig_config *m;
    nvmlReturn_t ret = mig_lookup(device, CALL_MEMORY, &d, &m);
    if (ret == NVML_SUCCESS && !result) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) *total = m->memory;
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    LOCKED_BEGIN();
    struct device_config *d;
    if (is_mig_handle(device)) {
        unsigned long long total = 0;
        if ((ret = mig_memory(device, memory, &total))) goto out;
        memory->total = memory->free = total;
        memory->used = 0;
        goto out;
    }
    if ((ret = lookup_into(device, CALL_MEMORY, memory, &d))) goto out;
    /* Version 1 counts reserved memory as used, as the real library does. */
    memory->total = d->memory_total;
    memory->used = d->memory_used + d->memory_reserved;
    memory->free = d->memory_total - memory->used;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    LOCKED_BEGIN();
    struct device_config *d;
    if (is_mig_handle(device)) {
        unsigned long long total = 0;
        if ((ret = mig_memory(device, memory, &total))) goto out;
        if (memory->version != NVML_MEMORY_V2) {
            ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
            goto out;
        }
        memory->total = memory->free = total;
        memory->reserved = memory->used = 0;
        goto out;
    }
    if ((ret = lookup_into(device, CALL_MEMORY, memory, &d))) goto out;
    if (memory->version != NVML_MEMORY_V2) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        goto out;
    }
    memory->total = d->memory_total;
    memory->reserved = d->memory_reserved;
    memory->used = d->memory_used;
    memory->free = d->memory_total - d->memory_used - d->memory_reserved;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup_into(device, CALL_PCI, pci, &d))) goto out;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", d->pci_domain & 0xFFFF,
             d->pci_bus, d->pci_device, d->pci_function);
    snprintf(pci->busId, sizeof pci->busId, "%s", d->pci_bus_id);
    pci->domain = d->pci_domain;
    pci->bus = d->pci_bus;
    pci->device = d->pci_device;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = d->pci_subsystem_id;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup_into(device, CALL_NUMA, node, &d))) goto out;
    if (!d->has_numa) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    *node = (unsigned)d->numa_node;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup_into(device, CALL_MINOR, minor, &d))) goto out;
    *minor = d->minor;
    LOCKED_END();
}

/* ---- events --------------------------------------------------------------------------------- */

static unsigned long long supported_events(const struct device_config *d) {
    return g_config.event_sets && d->events ? EVENT_SUPPORTED : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup_into(device, CALL_SUPPORTED_EVENTS, types, &d))) goto out;
    *types = supported_events(d);
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    LOCKED_BEGIN();
    if (!set) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (!g_config.event_sets) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    nvmlEventSet_t created = calloc(1, sizeof *created);
    if (!created) {
        ret = NVML_ERROR_UNKNOWN;
        goto out;
    }
    created->magic = EVENT_SET_MAGIC;
    *set = created;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = lookup(device, CALL_REGISTER_EVENTS, &d))) goto out;
    if (!set || set->magic != EVENT_SET_MAGIC) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (types & ~supported_events(d)) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    set->registered[device->index] |= types;
    LOCKED_END();
}

/* Finds an undelivered XID for a device registered in `set`. Called with g_lock held. */
static int next_event(nvmlEventSet_t set, unsigned *index, unsigned long long *xid) {
    for (unsigned i = 0; i < g_config.count; i++) {
        if ((set->registered[i] & EVENT_XID_CRITICAL) && g_config.devices[i].xid &&
            set->seen[i] < g_xid_seq[i]) {
            set->seen[i] = g_xid_seq[i];
            *index = i;
            *xid = g_config.devices[i].xid;
            return 1;
        }
    }
    return 0;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, unsigned timeout_ms, unsigned *index,
                               unsigned long long *xid) {
    /* The real library blocks in the kernel; polling the file every few milliseconds is the
     * closest a file-driven fake can come, and it notices a changed file while waiting. */
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        nvmlReturn_t ret = ready();
        if (ret == NVML_SUCCESS && (!set || set->magic != EVENT_SET_MAGIC)) ret = NVML_ERROR_INVALID_ARGUMENT;
        if (ret == NVML_SUCCESS && !next_event(set, index, xid)) ret = NVML_ERROR_TIMEOUT;
        pthread_mutex_unlock(&g_lock);
        if (ret != NVML_ERROR_TIMEOUT) return ret;
        long long left = deadline - now_ms();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, (left < 10 ? left : 10) * 1000000L};
        nanosleep(&pause, NULL);
    }
}

/* Waits for an XID event and fills in the fields that both versions of nvmlEventData share;
 * leaves them untouched when there is none. */
static nvmlReturn_t take_event(nvmlEventSet_t set, unsigned timeout_ms, nvmlDevice_t *device,
                               unsigned long long *type, unsigned long long *event_data) {
    unsigned index;
    unsigned long long xid;
    nvmlReturn_t ret = wait_event(set, timeout_ms, &index, &xid);
    if (ret != NVML_SUCCESS) return ret;
    pthread_mutex_lock(&g_lock);
    *device = handle_of(index);
    *type = EVENT_XID_CRITICAL;
    *event_data = xid;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = take_event(set, timeoutms, &data->device, &data->eventType, &data->eventData);
    if (ret != NVML_SUCCESS) return ret;
    /* Not a MIG instance: NVML reports all-ones for both ids. */
    data->gpuInstanceId = 0xFFFFFFFFu;
    data->computeInstanceId = 0xFFFFFFFFu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data, unsigned int timeoutms) {
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    return take_event(set, timeoutms, &data->device, &data->eventType, &data->eventData);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    LOCKED_BEGIN();
    if (!set || set->magic != EVENT_SET_MAGIC) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    set->magic = 0;
    free(set);
    LOCKED_END();
}

/* ---- MIG ------------------------------------------------------------------------------------- */

/* A GPU that the file gives no "migMode" does not support MIG (an L4, a V100): NOT_SUPPORTED. */
static nvmlReturn_t mig_parent(nvmlDevice_t device, enum call call, const void *result,
                               struct device_config **d) {
    nvmlReturn_t ret = lookup_into(device, call, result, d);
    if (ret == NVML_SUCCESS && !(*d)->mig_supported) ret = NVML_ERROR_NOT_SUPPORTED;
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = mig_parent(device, CALL_MIG_MODE, current, &d))) goto out;
    if (!pending) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    *current = *pending = (unsigned)d->mig_mode;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = mig_parent(device, CALL_MIG_MODE, count, &d))) goto out;
    *count = d->mig_mode ? MAX_MIG : 0; /* zero while MIG is disabled, as nvml.h says */
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *mig) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = mig_parent(device, CALL_MIG_HANDLE, mig, &d))) goto out;
    if (index >= MAX_MIG) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    ret = NVML_ERROR_NOT_FOUND; /* also while MIG is disabled, as an H200 on driver 580 answers */
    if (!d->mig_mode) goto out;
    for (unsigned i = 0; i < d->mig_count; i++) {
        if (d->migs[i].index == index) {
            struct nvmlDevice_st *h = &g_mig_handles[device->index][index];
            h->index = device->index;
            h->mig = index + 1;
            *mig = h;
            ret = NVML_SUCCESS;
        }
    }
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device) {
    LOCKED_BEGIN();
    struct device_config *d;
    struct mig_config *m;
    if ((ret = mig_lookup(mig, CALL_COUNT_, &d, &m))) goto out;
    if (!device) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    *device = handle_of(mig->index);
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    LOCKED_BEGIN();
    if (!is_mig) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (is_mig_handle(device)) {
        *is_mig = 1;
        goto out;
    }
    struct device_config *d;
    if ((ret = lookup(device, CALL_COUNT_, &d))) goto out;
    *is_mig = 0;
    LOCKED_END();
}

/* Both ids of a MIG device; asked of a whole GPU, the real library answers INVALID_ARGUMENT. */
static nvmlReturn_t mig_id(nvmlDevice_t device, unsigned int *id, int compute) {
    LOCKED_BEGIN();
    struct device_config *d;
    struct mig_config *m;
    if (!is_mig_handle(device)) {
        ret = lookup(device, CALL_COUNT_, &d);
        if (ret == NVML_SUCCESS) ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if ((ret = mig_lookup(device, CALL_COUNT_, &d, &m))) goto out;
    if (!id) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    *id = compute ? m->ci_id : m->gi_id;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mig_id(device, id, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mig_id(device, id, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gi) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = mig_parent(device, CALL_GPU_INSTANCE, gi, &d))) goto out;
    if (!d->mig_mode) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    ret = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < d->mig_count; i++) {
        if (d->migs[i].gi_id == id) {
            struct nvmlGpuInstance_st *h = &g_gi_handles[device->index][i];
            h->index = device->index;
            h->position = i;
            *gi = h;
            ret = NVML_SUCCESS;
            break;
        }
    }
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    LOCKED_BEGIN();
    if (!within(gi, g_gi_handles, sizeof g_gi_handles, sizeof g_gi_handles[0][0]) || !info) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    struct device_config *d;
    if ((ret = lookup(handle_of(gi->index), CALL_COUNT_, &d))) goto out;
    if (!d->mig_mode || gi->position >= d->mig_count) {
        ret = NVML_ERROR_INVALID_ARGUMENT; /* the instance was destroyed */
        goto out;
    }
    const struct mig_config *m = &d->migs[gi->position];
    info->device = handle_of(gi->index);
    info->id = m->gi_id;
    info->profileId = m->profile_id;
    info->placement.start = m->start;
    info->placement.size = m->size;
    LOCKED_END();
}

/* Profile info of a profile some instance of the GPU uses; the fake knows no others. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profile_id,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info) {
    LOCKED_BEGIN();
    struct device_config *d;
    if ((ret = mig_parent(device, CALL_GPU_INSTANCE, info, &d))) goto out;
    if (info->version != NVML_GPU_INSTANCE_PROFILE_INFO_V2) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        goto out;
    }
    ret = NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < d->mig_count; i++) {
        const struct mig_config *m = &d->migs[i];
        if (m->profile_id != profile_id) continue;
        unsigned slices = 0;
        sscanf(m->profile, "%u", &slices);
        memset((char *)info + sizeof info->version, 0, sizeof *info - sizeof info->version);
        info->id = profile_id;
        info->sliceCount = slices;
        info->instanceCount = MAX_MIG / (slices ? slices : 1);
        info->memorySizeMB = m->memory / MIB;
        snprintf(info->name, sizeof info->name, "MIG %s", m->profile);
        ret = NVML_SUCCESS;
        break;
    }
    LOCKED_END();
}

/* ---- NVLink and PCIe topology ------------------------------------------------------------- */

/* A GPU without "nvlinks" has none (NOT_SUPPORTED); a link the file does not list is inactive
 * for its state and NOT_SUPPORTED for its remote, past the last link INVALID_ARGUMENT. */
static nvmlReturn_t nvlink_of(nvmlDevice_t device, enum call call, unsigned link, const void *result,
                              const struct nvlink_config **out) {
    struct device_config *d;
    nvmlReturn_t ret = lookup_into(device, call, result, &d);
    if (ret != NVML_SUCCESS) return ret;
    if (!d->has_nvlinks) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= MAX_NVLINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *out = NULL;
    for (unsigned i = 0; i < d->nvlink_count; i++) {
        if (d->nvlinks[i].link == link) *out = &d->nvlinks[i];
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *active) {
    LOCKED_BEGIN();
    const struct nvlink_config *l;
    if ((ret = nvlink_of(device, CALL_NVLINK_STATE, link, active, &l))) goto out;
    *active = l && l->active;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    LOCKED_BEGIN();
    const struct nvlink_config *l;
    if ((ret = nvlink_of(device, CALL_NVLINK_REMOTE, link, pci, &l))) goto out;
    if (!l) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", l->remote_domain & 0xFFFF,
             l->remote_bus, l->remote_device, l->remote_function);
    snprintf(pci->busId, sizeof pci->busId, "%s", l->remote_bus_id);
    pci->domain = l->remote_domain;
    pci->bus = l->remote_bus;
    pci->device = l->remote_device;
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, unsigned int *type) {
    LOCKED_BEGIN();
    const struct nvlink_config *l;
    if ((ret = nvlink_of(device, CALL_NVLINK_REMOTE, link, type, &l))) goto out;
    if (!l) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    *type = l->remote_is_switch ? 2u : 0u; /* NVML_NVLINK_DEVICE_TYPE_SWITCH : _GPU */
    LOCKED_END();
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t first, nvmlDevice_t second, unsigned int *level) {
    LOCKED_BEGIN();
    struct device_config *a, *b;
    if ((ret = lookup_into(first, CALL_TOPOLOGY, level, &a))) goto out;
    if ((ret = lookup(second, CALL_TOPOLOGY, &b))) goto out;
    if (!g_config.has_topology) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    *level = g_config.topology[first->index][second->index];
    LOCKED_END();
}
