# Declarations from gguf.h, one to one (pinned llama.cpp: thirdparty/llama.cpp/ggml/include/gguf.h).
#
# GGUF file layout: magic "GGUF", version (uint32), n_tensors (int64), n_kv (int64), the KV pairs
# (key string, gguf_type, value; arrays carry element type and count), the tensor infos (name,
# n_dims, ne[], ggml_type, offset in the data blob) and the aligned tensor data blob.
# Alignment is "general.alignment" (uint32) if present, else GGUF_DEFAULT_ALIGNMENT.

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdio cimport FILE

# gguf.h #includes ggml.h: cimport * of this module brings in ggml.pxd's names too
from polyllama.includes.ggml cimport *


cdef extern from "gguf.h" nogil:

    const char * GGUF_MAGIC  # "GGUF"
    const int GGUF_VERSION
    const char * GGUF_KEY_GENERAL_ALIGNMENT  # "general.alignment"
    const int GGUF_DEFAULT_ALIGNMENT

    # types that can be stored as GGUF KV data
    enum gguf_type:
        GGUF_TYPE_UINT8    # 0
        GGUF_TYPE_INT8     # 1
        GGUF_TYPE_UINT16   # 2
        GGUF_TYPE_INT16    # 3
        GGUF_TYPE_UINT32   # 4
        GGUF_TYPE_INT32    # 5
        GGUF_TYPE_FLOAT32  # 6
        GGUF_TYPE_BOOL     # 7
        GGUF_TYPE_STRING   # 8
        GGUF_TYPE_ARRAY    # 9
        GGUF_TYPE_UINT64   # 10
        GGUF_TYPE_INT64    # 11
        GGUF_TYPE_FLOAT64  # 12
        GGUF_TYPE_COUNT    # marks the end of the enum

    cdef struct gguf_context  # opaque

    struct gguf_init_params:
        bint no_alloc
        # if not NULL, create a ggml_context and allocate the tensor data in it
        ggml_context ** ctx

    # callback to simulate or wrap a FILE pointer - read up to `len` bytes at `offset` into `output` and return the number of bytes read
    ctypedef size_t (*gguf_reader_callback_t)(void * userdata, void * output, uint64_t offset, size_t len) noexcept

    gguf_context * gguf_init_empty()
    gguf_context * gguf_init_from_file_ptr(FILE * file, gguf_init_params params)
    gguf_context * gguf_init_from_file(const char * fname, gguf_init_params params)
    gguf_context * gguf_init_from_buffer(const void * data, size_t size, gguf_init_params params)

    # max_chunk_read is the maximum number of bytes that the GGUF code will read at once from the callback, a value of 0 means no limit
    gguf_context * gguf_init_from_callback(gguf_reader_callback_t callback, void * userdata, size_t max_chunk_read, uint64_t max_expected_size, gguf_init_params params)

    void gguf_free(gguf_context * ctx)

    const char * gguf_type_name(gguf_type type)

    uint32_t gguf_get_version    (const gguf_context * ctx)
    size_t   gguf_get_alignment  (const gguf_context * ctx)
    size_t   gguf_get_data_offset(const gguf_context * ctx)  # padded to gguf_get_alignment if and only if the gguf_context contains at least one tensor

    int64_t      gguf_get_n_kv(const gguf_context * ctx)
    int64_t      gguf_find_key(const gguf_context * ctx, const char * key)  # returns -1 if key is not found
    const char * gguf_get_key (const gguf_context * ctx, int64_t key_id)

    gguf_type gguf_get_kv_type (const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_arr_type(const gguf_context * ctx, int64_t key_id)

    # will abort if the wrong type is used for the key
    uint8_t      gguf_get_val_u8  (const gguf_context * ctx, int64_t key_id)
    int8_t       gguf_get_val_i8  (const gguf_context * ctx, int64_t key_id)
    uint16_t     gguf_get_val_u16 (const gguf_context * ctx, int64_t key_id)
    int16_t      gguf_get_val_i16 (const gguf_context * ctx, int64_t key_id)
    uint32_t     gguf_get_val_u32 (const gguf_context * ctx, int64_t key_id)
    int32_t      gguf_get_val_i32 (const gguf_context * ctx, int64_t key_id)
    float        gguf_get_val_f32 (const gguf_context * ctx, int64_t key_id)
    uint64_t     gguf_get_val_u64 (const gguf_context * ctx, int64_t key_id)
    int64_t      gguf_get_val_i64 (const gguf_context * ctx, int64_t key_id)
    double       gguf_get_val_f64 (const gguf_context * ctx, int64_t key_id)
    bint         gguf_get_val_bool(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_val_str (const gguf_context * ctx, int64_t key_id)
    const void * gguf_get_val_data(const gguf_context * ctx, int64_t key_id)
    size_t       gguf_get_arr_n   (const gguf_context * ctx, int64_t key_id)

    # get raw pointer to the first element of the array with the given key_id
    # for bool arrays, note that they are always stored as int8 on all platforms (usually this makes no difference)
    const void * gguf_get_arr_data(const gguf_context * ctx, int64_t key_id)

    # get ith C string from array with given key_id
    const char * gguf_get_arr_str (const gguf_context * ctx, int64_t key_id, size_t i)

    int64_t         gguf_get_n_tensors    (const gguf_context * ctx)
    int64_t         gguf_find_tensor      (const gguf_context * ctx, const char * name)  # returns -1 if the tensor is not found
    size_t          gguf_get_tensor_offset(const gguf_context * ctx, int64_t tensor_id)
    const char *    gguf_get_tensor_name  (const gguf_context * ctx, int64_t tensor_id)
    const int64_t * gguf_get_tensor_ne    (const gguf_context * ctx, int64_t tensor_id)  # returns ne, an array of GGML_MAX_DIMS elements; ne[dim] is 1 for dim >= n_dims
    ggml_type       gguf_get_tensor_type  (const gguf_context * ctx, int64_t tensor_id)
    size_t          gguf_get_tensor_size  (const gguf_context * ctx, int64_t tensor_id)

    # removes key if it exists, returns id that the key had prior to removal (-1 if it didn't exist)
    int64_t gguf_remove_key(gguf_context * ctx, const char * key)

    # overrides an existing KV pair or adds a new one, the new KV pair is always at the back
    void gguf_set_val_u8  (gguf_context * ctx, const char * key, uint8_t      val)
    void gguf_set_val_i8  (gguf_context * ctx, const char * key, int8_t       val)
    void gguf_set_val_u16 (gguf_context * ctx, const char * key, uint16_t     val)
    void gguf_set_val_i16 (gguf_context * ctx, const char * key, int16_t      val)
    void gguf_set_val_u32 (gguf_context * ctx, const char * key, uint32_t     val)
    void gguf_set_val_i32 (gguf_context * ctx, const char * key, int32_t      val)
    void gguf_set_val_f32 (gguf_context * ctx, const char * key, float        val)
    void gguf_set_val_u64 (gguf_context * ctx, const char * key, uint64_t     val)
    void gguf_set_val_i64 (gguf_context * ctx, const char * key, int64_t      val)
    void gguf_set_val_f64 (gguf_context * ctx, const char * key, double       val)
    void gguf_set_val_bool(gguf_context * ctx, const char * key, bint         val)
    void gguf_set_val_str (gguf_context * ctx, const char * key, const char * val)

    # creates a new array with n elements of the given type and copies the corresponding number of bytes from data
    void gguf_set_arr_data(gguf_context * ctx, const char * key, gguf_type type, const void * data, size_t n)

    # creates a new array with n strings and copies the corresponding strings from data
    void gguf_set_arr_str (gguf_context * ctx, const char * key, const char ** data, size_t n)

    # set or add KV pairs from another context
    void gguf_set_kv(gguf_context * ctx, const gguf_context * src)

    # add tensor to GGUF context, tensor name must be unique
    void gguf_add_tensor(gguf_context * ctx, const ggml_tensor * tensor)

    # after changing a tensor's type, the offsets of all tensors with higher indices are immediately recalculated
    #   in such a way that the tensor data remains as one contiguous block (except for padding)
    void gguf_set_tensor_type(gguf_context * ctx, const char * name, ggml_type type)

    # assumes that at least gguf_get_tensor_size bytes can be read from data
    void gguf_set_tensor_data(gguf_context * ctx, const char * name, const void * data)

    # writing gguf files: either the whole context in one pass (gguf_write_to_file(..., only_meta=false)),
    # or the meta data only and the tensor data appended, or a placeholder of gguf_get_meta_size()
    # bytes, then the tensor data, then the meta data from gguf_get_meta_data() (see gguf.h)

    # write the entire context to a binary file
    bint gguf_write_to_file_ptr(const gguf_context * ctx, FILE * file, bint only_meta)
    bint gguf_write_to_file(const gguf_context * ctx, const char * fname, bint only_meta)

    # get the size in bytes of the meta data (header, kv pairs, tensor info) including padding
    size_t gguf_get_meta_size(const gguf_context * ctx)

    # writes the meta data to pointer "data"
    void   gguf_get_meta_data(const gguf_context * ctx, void * data)
