#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace specula {

Status MappedFile::open(const std::string& path, std::unique_ptr<MappedFile>* out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError("cannot open '" + path + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return IoError("'" + path + "' is not a regular file");
    }
    const size_t size = size_t(st.st_size);
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

MappedFile::~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace specula
