#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace specula {

Status MappedFile::open(const std::string& path, std::unique_ptr<MappedFile>* out, bool copy) {
    // Non-blocking: opening a FIFO without a writer would otherwise wait forever (it is then
    // refused below, as is anything but a regular file).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return IoError("cannot open '" + path + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return IoError("'" + path + "' is not a regular file");
    }
    const size_t size = size_t(st.st_size);
    if (copy) {
        std::vector<uint8_t> bytes(size);
        size_t done = 0;
        while (done < size) {
            const ssize_t r = ::pread(fd, bytes.data() + done, size - done, off_t(done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                const std::string why = r < 0 ? std::strerror(errno) : "the file shrank";
                ::close(fd);
                return IoError("cannot read '" + path + "': " + why);
            }
            done += size_t(r);
        }
        ::close(fd);
        out->reset(new MappedFile(std::move(bytes)));
        return Status::Ok();
    }
    const uint8_t* data = nullptr;
    if (size > 0) {
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            return IoError("cannot map '" + path + "': " + std::strerror(err));
        }
        data = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    out->reset(new MappedFile(data, size));
    return Status::Ok();
}

void MappedFile::release(std::span<const uint8_t> range) const {
    // Addresses as integers: `<` between pointers into different objects is unspecified.
    const auto first = reinterpret_cast<uintptr_t>(range.data());
    const auto mapped = reinterpret_cast<uintptr_t>(data_);
    if (!copy_.empty() || data_ == nullptr || first < mapped ||
        first + range.size() > mapped + size_)
        return;
    const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (first + page - 1) & ~(page - 1);
    const uintptr_t end = (first + range.size()) & ~(page - 1);
    // Advice: a mapping that keeps its pages is only larger.
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
    if (data_ != nullptr && copy_.empty()) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace specula
