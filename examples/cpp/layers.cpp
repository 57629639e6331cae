// Streams a checkpoint layer by layer through two slots with weightlift's C API from C++, and reads it by LBA
// through a region table; checks every byte against std::ifstream reads. Exits 0 when all bytes match, 1 on a
// mismatch, 2 on an error.
//
//   c++ -std=c++17 -O2 -Iinclude examples/cpp/layers.cpp -Ltarget/release -lweightlift_capi
//       -Wl,-rpath,"$PWD/target/release" -o layers          (one command line)
//   ./layers model.safetensors [cpu|cuda:N]
//
// Tensors named `...layers.<N>....` (or `...h.<N>....`) form layer N; every other tensor forms one more layer.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "weightlift.h"

namespace {

struct Error : std::runtime_error {
    explicit Error(const std::string &what, wl_status s)
        : std::runtime_error(what + ": " + wl_status_name(s) + ": " + wl_last_error()) {}
};

void check(wl_status s, const std::string &what) {
    if (s != WL_OK) throw Error(what, s);
}

// Owning handles: each object is closed exactly once, on every path.
struct EngineDel { void operator()(wl_engine *e) const { wl_engine_close(e); } };
struct CkptDel { void operator()(wl_checkpoint *c) const { wl_checkpoint_close(c); } };
struct LayersDel { void operator()(wl_layers *l) const { wl_layers_close(l); } };
struct BlockDel { void operator()(wl_block *b) const { wl_block_close(b); } };
struct RegionsDel { void operator()(wl_regions *r) const { wl_regions_free(r); } };

std::vector<unsigned char> file_bytes(const std::string &path, uint64_t offset, uint64_t len) {
    std::ifstream f(path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    std::vector<unsigned char> out(len);
    f.read(reinterpret_cast<char *>(out.data()), static_cast<std::streamsize>(len));
    if (!f && len > 0) throw std::runtime_error("cannot read " + path);
    return out;
}

// Bytes at `ptr` of `device` (host memory, or device memory read back).
std::vector<unsigned char> memory_bytes(wl_engine *engine, int device, uint64_t ptr, uint64_t len) {
    std::vector<unsigned char> out(len);
    if (device == WL_HOST) {
        if (len) std::memcpy(out.data(), reinterpret_cast<const void *>(static_cast<uintptr_t>(ptr)), len);
    } else {
        check(wl_cuda_copy_to_host(engine, device, ptr, out.data(), len), "reading device memory back");
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) try {
    if (argc < 2 || argc > 3) {
        std::fprintf(stderr, "usage: %s CHECKPOINT [cpu|cuda:N]\n", argv[0]);
        return 2;
    }
    const std::string path = argv[1];
    int device = WL_HOST;
    if (argc == 3 && std::string(argv[2]).rfind("cuda:", 0) == 0) device = std::stoi(argv[2] + 5);

    wl_engine *e = nullptr;
    check(wl_engine_open(nullptr, &e), "opening an engine");
    std::unique_ptr<wl_engine, EngineDel> engine(e);
    wl_checkpoint *c = nullptr;
    check(wl_checkpoint_open(path.c_str(), &c), path);
    std::unique_ptr<wl_checkpoint, CkptDel> ckpt(c);

    // Group tensors into layers by the number after "layers." or "h.".
    const size_t n = wl_checkpoint_len(ckpt.get());
    std::vector<wl_tensor_info> info(n);
    std::vector<uint32_t> layer_of(n);
    const std::regex numbered(R"((^|\.)(layers|h)\.(\d+)\.)");
    uint32_t layers = 0;
    std::vector<bool> numbered_tensor(n);
    for (size_t i = 0; i < n; i++) {
        check(wl_checkpoint_tensor(ckpt.get(), i, &info[i]), "describing a tensor");
        std::cmatch m;
        if (std::regex_search(info[i].name, m, numbered)) {
            layer_of[i] = static_cast<uint32_t>(std::stoul(m[3].str()));
            numbered_tensor[i] = true;
            layers = std::max(layers, layer_of[i] + 1);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!numbered_tensor[i]) layer_of[i] = layers;  // the rest: one more layer
    }
    layers += 1;

    wl_layers *l = nullptr;
    check(wl_layers_open(engine.get(), ckpt.get(), layer_of.data(), layers, device, 2, &l), "opening a streamer");
    std::unique_ptr<wl_layers, LayersDel> streamer(l);

    // Two passes, as a decoder does for two tokens; every layer checked each time.
    int mismatches = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < layers; i++) {
            wl_layer view{};
            check(wl_layers_load(streamer.get(), i, nullptr, &view), "loading layer " + std::to_string(i));
            for (size_t k = 0; k < view.count; k++) {
                const wl_tensor_info &t = info[view.tensors[k]];
                if (memory_bytes(engine.get(), device, view.base + view.offsets[k], t.nbytes) !=
                    file_bytes(t.file, t.offset, t.nbytes)) {
                    std::fprintf(stderr, "layers: tensor %s of layer %u differs\n", t.name, i);
                    mismatches++;
                }
            }
        }
    }
    wl_layers_stats stats{};
    check(wl_layers_stats_get(streamer.get(), &stats), "stats");

    // The same file read by LBA: a region "first" holding its first blocks, read by kind.
    wl_block *b = nullptr;
    check(wl_block_open(engine.get(), path.c_str(), 512, &b), "opening " + path + " by LBA");
    std::unique_ptr<wl_block, BlockDel> block(b);
    uint32_t block_size = 0;
    uint64_t blocks = 0;
    check(wl_block_info(block.get(), &block_size, &blocks), "block info");
    wl_regions *r = nullptr;
    check(wl_regions_new(block.get(), &r), "regions");
    std::unique_ptr<wl_regions, RegionsDel> regions(r);
    const uint64_t first = std::min<uint64_t>(blocks, 8);
    check(wl_regions_set(regions.get(), "first", 0, first), "defining a region");
    std::vector<unsigned char> got(first * block_size);
    if (first > 0) {
        wl_mem dest{WL_HOST, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(got.data())), got.size()};
        check(wl_regions_read(regions.get(), "first", 1, first - 1, dest), "reading region first");
        got.resize((first - 1) * block_size);
        if (got != file_bytes(path, block_size, got.size())) {
            std::fprintf(stderr, "layers: region read differs from the file\n");
            mismatches++;
        }
    }
    // Past the region: an error, not a read.
    wl_mem none{WL_HOST, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(got.data())), got.size()};
    if (wl_regions_read(regions.get(), "first", first, 1, none) == WL_OK) {
        std::fprintf(stderr, "layers: a read past the region succeeded\n");
        mismatches++;
    }

    std::printf("layers: %u layers x 2 passes through 2 slots on %s: %llu loads, %.3f s reading, %.3f s waiting, "
                "%llu of %llu requests ready; LBA region of %llu blocks; %d mismatches\n",
                layers, device == WL_HOST ? "cpu" : argv[2], static_cast<unsigned long long>(stats.loads),
                stats.load_seconds, stats.wait_seconds, static_cast<unsigned long long>(stats.ready_hits),
                static_cast<unsigned long long>(stats.requests), static_cast<unsigned long long>(first), mismatches);
    return mismatches ? 1 : 0;
} catch (const std::exception &ex) {
    std::fprintf(stderr, "layers: %s\n", ex.what());
    return 2;
}
